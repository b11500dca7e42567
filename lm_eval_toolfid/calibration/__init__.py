"""Null calibration: PEFT adapter folders (``adapters``: checks, shape, update norm, whether one calibration serves
a run's adapters), null adapters and the frozen spec a run asks for (``nulls``), the fit and its comparisons
(``fit``: z, rank p), and calibration from existing results (``posthoc``). The in-process workflow that runs a
model lives in :mod:`lm_eval_toolfid.run.calibrate`.
"""
