"""Running the views of ``toolfid run`` (and calibration): what a run evaluates (``plan``: :class:`RunPlan`),
one runner for every way of evaluating views (``runner``: base view, calibration stage, adapter views,
``--resume``, each view saved as it finishes), the sessions behind its one interface (``session``: a base
loaded once with many adapters; ``served_session``: models behind a server), null calibration in process
(``calibrate``: :class:`CalibrationStage`). Each view is an ordinary lm-eval evaluation of the task
(``integrations/lm_eval``); its files are :mod:`lm_eval_toolfid.reporting.view_store`'s."""
