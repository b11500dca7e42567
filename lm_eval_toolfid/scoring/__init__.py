"""The scoring core: text → calls → :class:`Outcome` (``outcome``) → two views → :class:`PairScore`
(``compare``) → :data:`METRICS` and :class:`Summary` (``metrics``) → :class:`Verdict` (``verdict``).

Every entry point (the lm-eval task, ``toolfid run``, ``score``, ``check``, reports) calls these
functions; nothing is computed two ways.
"""
