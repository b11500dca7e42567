"""``toolfid run --backend vllm``: the base and every adapter in one vLLM engine in this process, every view's
requests in one batch (each with its own ``LoRARequest``), scored through the same lm-eval task
(:mod:`~lm_eval_toolfid.run.vllm_session`; the engine: :mod:`~lm_eval_toolfid.integrations.vllm.model`)."""
