"""Running the views of ``toolfid run`` (and calibration): a base loaded once with many adapters
(``session``), models behind a server (``served_session``), the views in order with ``--resume``
(``views``), null calibration in process (``calibrate``). Each view is an ordinary lm-eval evaluation of the
task (``integrations/lm_eval``); its files are :mod:`lm_eval_toolfid.reporting.view_store`'s."""
