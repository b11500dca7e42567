"""Grouped-query attention folded over the unexpanded KV cache (engine/attention.py).

The fold must be bitwise equal to transformers' expanded computation wherever it is used: checked
against torch's SDPA on random tensors over every query length the rule admits (and shown not to be
vacuous: where the rule refuses, some lengths really differ), and end to end — a small grouped-query
model's engine runs (shared prefixes, verified drafts) give the same tokens and the same top-two gaps,
bit for bit, with and without it.
"""

from __future__ import annotations

from typing import Any

import pytest


def _expanded_and_folded(q: int, n: int, kv: int, seed: int = 0) -> tuple[Any, Any]:
    import torch

    from lm_eval_toolfid.engine.attention import _fold

    gen = torch.Generator().manual_seed(seed)
    B, G, d = 2, 2, 64
    query = torch.randn(B, q, G * n, d, generator=gen).transpose(1, 2)
    k, v = (torch.randn(B, G, kv, d, generator=gen) for _ in range(2))
    mask = torch.ones(B, 1, q, kv, dtype=torch.bool).tril(kv - q)
    mask[1, :, :, :kv // 4] = False  # left padding on one row
    ref = torch.nn.functional.scaled_dot_product_attention(
        query, k.repeat_interleave(n, 1), v.repeat_interleave(n, 1), attn_mask=mask)
    return ref, _fold(query, k, v, mask, n, None)


@pytest.mark.parametrize("n", [3, 7])
def test_fold_is_bitwise_where_the_rule_admits_it(n: int) -> None:
    import torch

    from lm_eval_toolfid.engine.attention import fold_checked, fold_is_exact

    assert fold_checked(n, 64, torch.float32)
    refused_and_different = 0
    for q in range(2, 140):
        if not fold_is_exact(q, n) and refused_and_different:
            continue  # one refused length that differs shows the rule guards something; the others add nothing
        ref, out = _expanded_and_folded(q, n, kv=q + 100)
        if fold_is_exact(q, n):
            assert torch.equal(ref, out), f"q={q}, n={n}: the fold rounds otherwise where the rule admits it"
        else:
            refused_and_different += not torch.equal(ref, out)
    assert refused_and_different, "the rule refuses lengths that are in fact exact: it guards nothing"


def test_the_wrapper_leaves_other_calls_to_transformers() -> None:
    import torch

    from lm_eval_toolfid.engine.attention import folded_gqa, folded_gqa_attention

    calls = []

    def original(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kw: Any) -> tuple[Any, None]:
        calls.append(query.shape[2])
        return torch.zeros(1), None

    class Module:
        num_key_value_groups = 7

    wrapped = folded_gqa(original)
    q = torch.randn(1, 14, 4, 64)
    kv = torch.randn(1, 2, 30, 64)
    mask = torch.ones(1, 1, 4, 30, dtype=torch.bool)
    wrapped(Module(), q[:, :, :1], kv, kv, mask[:, :, :1])  # one query token: pack_gqa's case
    wrapped(Module(), q, kv, kv, None, is_causal=True)  # no mask
    wrapped(Module(), q[:, :, :2], kv, kv, mask[:, :, :2])  # a length the rule refuses (2)
    assert calls == [1, 4, 2]
    out, _ = wrapped(Module(), q, kv, kv, mask)  # folded: transformers' [B, q, H, d] layout
    assert calls == [1, 4, 2] and out.shape == (1, 4, 14, 64)

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with folded_gqa_attention():
        assert getattr(ALL_ATTENTION_FUNCTIONS["sdpa"], "toolfid_folded", False)
        with folded_gqa_attention():  # nested: still one wrapper
            assert ALL_ATTENTION_FUNCTIONS["sdpa"].__closure__ is not None
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (14, 2)])
def test_engine_outputs_and_gaps_are_bitwise_the_same_with_the_fold(heads: int, kv_heads: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-layer grouped-query model (SmolLM2's and Qwen's head grouping), prompts sharing prefixes of
    many lengths, plain and verified: every token and every top-two gap identical with and without the fold."""
    import random

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lm_eval_toolfid.engine import attention
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row

    folds = []
    fold = attention._fold
    monkeypatch.setattr(attention, "_fold", lambda *a: folds.append(a[0].shape[2]) or fold(*a))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=64 * heads, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64,
                         max_position_embeddings=2048)
    model = Qwen2ForCausalLM(config).eval()
    rng = random.Random(1)
    heads_ = [[rng.randrange(1, 512) for _ in range(rng.randrange(20, 200))] for _ in range(3)]
    prompts = [heads_[i % 3] + [rng.randrange(1, 512) for _ in range(rng.randrange(1, 90))] for i in range(18)]

    class Budget:
        def __init__(self) -> None:
            self.n = 0

        def push(self, token: int) -> str | None:
            self.n += 1
            return "length" if self.n >= 24 else None

    def run(fold: bool, drafts: list[list[int]] | None = None) -> list[Any]:
        rows = [Row(prompt=p, stopper=Budget(), max_new=24, draft=drafts[i] if drafts else ())
                for i, p in enumerate(prompts)]
        engine = GreedyEngine(model, 0, EngineConfig(max_batch=8, prefill_tokens=600, record_gaps=True,
                                                     first_chunk=5, fold_gqa=fold))
        return engine.run(rows)

    plain, folded = run(False), run(True)
    assert len(set(folds)) > 5, "the fold did not run on passes of many lengths"
    assert [r.tokens for r in plain] == [r.tokens for r in folded]
    assert [r.gaps for r in plain] == [r.gaps for r in folded]
    drafts = [r.tokens for r in plain]
    v_plain, v_folded = run(False, drafts), run(True, drafts)
    assert [r.tokens for r in v_plain] == [r.tokens for r in v_folded]
    assert [r.gaps for r in v_plain] == [r.gaps for r in v_folded]
    assert sum(r.verified for r in v_folded) > 0
