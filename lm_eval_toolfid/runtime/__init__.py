"""Running models: lm-eval's HF backend with toolfid's generation (``hflm``), per-row stopping at the
end of the call (``stopping``), one loaded base with many adapters (``session``), the views of a
``toolfid run`` and their files (``views``, ``view_store``), in-process calibration (``calibrate``),
and real models prepared from PyPI (``models``).
"""
