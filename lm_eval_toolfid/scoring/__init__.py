"""The scoring core: text → calls → :class:`Outcome` (``outcome``) → two views → :class:`PairScore`
(``compare``) → :data:`METRICS` and :class:`Summary` (``metrics``, per turn depth too) → :class:`Verdict`
(``verdict``); ``grounding`` says which expected values come from a tool result of a conversation.

Every entry point (the lm-eval task, ``toolfid run``, ``score``, ``check``, reports) calls these
functions; nothing is computed two ways.
"""
