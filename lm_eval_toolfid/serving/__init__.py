"""Talking to OpenAI-compatible servers (vLLM, SGLang, llama.cpp, ``transformers serve``): ``client`` sends
the requests, retries what a busy server refuses, journals each answer and turns it into the text the
scorer reads. No lm-eval import: the ``toolfid-server`` model class (``integrations/lm_eval``) uses it."""
