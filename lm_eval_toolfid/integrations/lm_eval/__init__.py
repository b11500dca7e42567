"""The ``tool_use_fidelity`` lm-eval task: its settings (``settings``, from lm-eval's merged
metadata), one run from build to its one finish step (``fidelity_run``), and the thin glue lm-eval
calls (``task``). The YAMLs live in the top-level ``tasks/`` folder, shipped as ``lm_eval_toolfid.tasks``.
"""
