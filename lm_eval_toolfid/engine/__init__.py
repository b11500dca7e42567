"""The greedy generation engine: no lm-eval import (``tests/test_layout.py`` enforces it).

A view's rows (prompt token ids, stop rules, optionally the base's answer as a draft) go in, each row's
tokens and how they were obtained come out. ``decoding`` (the engine and its stages), ``prefix_cache``
(prompt prefixes rows share, computed once), ``attention`` (grouped-query attention over the unexpanded
KV cache on CPU), ``stopping`` (each row's stop rule: EOS, ``until``, the end of the call),
``batch_size`` (``auto`` from free memory, halving on out-of-memory) and ``verify_policy`` (whether an
adapter view verifies or decodes, by dtype).
"""
