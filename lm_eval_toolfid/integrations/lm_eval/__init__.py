"""The ``tool_use_fidelity`` lm-eval task: its settings (``settings``, from lm-eval's merged
metadata), one run from build to its one finish step (``fidelity_run``), the thin glue lm-eval
calls (``task``), and the model classes that generate its requests: ``hf_model`` (``toolfid-hf``: lm-eval's
HFLM with toolfid's engine), ``served_model`` (``toolfid-server``), with ``generation_record`` summing how a
view's tokens were obtained. The YAMLs live in the top-level ``tasks/`` folder, shipped as ``lm_eval_toolfid.tasks``.
"""
