"""The greedy generation engine: no lm-eval import (``tests/test_layout.py`` enforces it).

A view's rows (prompt token ids, stop rules, optionally the base's answer as a draft) go in, each row's
tokens and how they were obtained come out. ``decoding`` is the entry point (:class:`GreedyEngine`, the loop
over the stages, and the public names re-exported) and its docstring is the map. The stages, in order:

- ``admission``: the order rows are admitted in, and the passes that admit them -> a ``StageResult``;
- ``prompt_pass``: shared prefixes computed once (``prefix_cache`` plans them), then each group's prompt
  pass -> rows finished, ``Joining`` or ``Drafting`` (each with a ``KVRef`` to its KV);
- ``draft_verify``: drafts verified chunk by chunk -> rows finished or ``Joining``;
- ``decode_batch``: joining rows take decode slots; one decode step; rows that stop are released;
- ``acceptance``: every emitted token (draft acceptance, near ties, each row's stop rule: the caller gives it;
  lm-eval's is ``integrations.lm_eval.stopping``).

Underneath them: ``handoffs`` (the typed hand-offs between stages), ``kv_store`` (every allocation, copy and
release of KV buffers), ``slot_cache`` (the cache classes the model writes into), ``passes`` (grouping rows
into passes, building one), ``model_runner`` (whether a model fits, one forward pass, argmax and gaps),
``rows`` and ``config`` (the public records), ``attention`` (grouped-query attention over the unexpanded
KV cache on CPU). The policies of the lm-eval model that drives the engine (its stop rules, ``auto`` batch size,
whether a view verifies) live with it in ``integrations/lm_eval/`` (``stopping``, ``batch_size``,
``verify_policy``): the engine imports nothing of formats or lm-eval.
"""
