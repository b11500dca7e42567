"""What other frameworks load: the lm-eval task (``lm_eval``) and the vLLM backend (``vllm``)."""
