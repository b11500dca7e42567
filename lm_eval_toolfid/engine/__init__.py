"""The greedy generation engine: a view's rows (prompt token ids, stop rules, optionally the base's answer as a
draft) go in, each row's tokens and how they were obtained come out. No lm-eval import (``tests/test_layout.py``).

``decoding.GreedyEngine`` is the entry point; ``scheduler`` decides what runs next (admission, passes, refill,
drafting) and the stages (``admission``, ``prompt_pass``, ``draft_verify``, ``decode_batch``, ``acceptance``)
execute it, handing each other the records of ``handoffs``; one run's settings travel as ``config.RunContext``.
The map of the stages and what lies underneath them: docs/architecture.md, "The engine's stages".
"""
