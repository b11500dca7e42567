"""Talking to OpenAI-compatible servers (vLLM, SGLang, llama.cpp, ``transformers serve``, gateways, hosted
providers): ``connection`` holds the settings every request shares (the key, headers, timeouts, retries,
rate-limit waits; secrets never shown) and builds the ``httpx2`` client, ``client`` sends the requests,
retries what a failing server answers, journals each answer and turns it into the text the scorer reads,
``pacing`` honours ``Retry-After`` and steps the requests in flight down and up. No lm-eval import: the
``toolfid-server`` model class (``integrations/lm_eval``) uses it."""
