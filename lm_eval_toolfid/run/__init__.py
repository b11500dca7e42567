"""Running the views of ``toolfid run`` (and calibration), in layers that import only downwards:

- ``plan``: what a run evaluates (:class:`RunPlan`, with its null calibration as a frozen
  :class:`~lm_eval_toolfid.calibration.nulls.CalibrationSpec`): plain values;
- ``views``: one view as an ordinary lm-eval evaluation of the task, shared by every session;
- ``session`` (a base loaded once with many adapters; it runs calibrations) and ``served_session`` (models behind
  a server; it refuses calibration in one line): the sessions behind the runner's one interface;
- ``runner``: the base view, the session's calibration, the adapter views, ``--resume``, each view saved as it
  finishes (files: :mod:`lm_eval_toolfid.reporting.view_store`);
- ``calibrate``: ``toolfid calibrate`` in process.

What the run then prints is :mod:`lm_eval_toolfid.reporting.run_report`'s."""
