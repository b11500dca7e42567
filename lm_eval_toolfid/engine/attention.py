"""Grouped-query attention over a cache without copying the cache per query head (CPU).

transformers' SDPA path expands a grouped-query model's key/value heads to one per query head
(``repeat_kv``: Qwen2.5-0.5B's 2 KV heads become 14) before every masked pass of more than one token —
a copy of the whole cache per layer per pass. A draft or prompt-suffix pass of a few tokens over a long
cache is then mostly that copy (profile: docs/performance.md). :func:`folded_gqa` runs the same attention
with the query heads of each KV head folded into the query length instead: ``[B, G*n, q, d] -> [B, G, n*q, d]``
against the unexpanded ``[B, G, kv, d]`` keys and values, the mask repeated for the ``n`` folded heads. Each
output row is the same dot products and softmax over the same key blocks as before, and draft-sized passes are
several times faster.

Bitwise equal — where it is used. torch's CPU flash attention computes query rows in blocks (32 rows, 64
from 192 query rows, 256 from 768) and a block of 1–3 rows takes another matrix-product kernel that rounds
otherwise; folding moves rows between blocks. So the fold runs only where neither layout has such a tail
block (:func:`fold_is_exact`), and only once a probe on this machine has confirmed that rule for the model's
head grouping, head size and dtype (:func:`fold_checked`: ~200 query lengths, once per process); where the
probe disagrees the fold is off. Otherwise only: CPU tensors, a mask given (no ``is_causal`` shortcut), more
than one query token (a single token already attends without the copy: transformers' ``pack_gqa``), no
dropout, soft-capping or position bias. Everything else goes to transformers' own function unchanged.
tests/test_attention.py checks the rule on random tensors, and a small model with SmolLM2's and Qwen's head
grouping through the engine (every token and top-two gap bitwise the same with and without the fold);
bench/bench_gqa_fold.py does the same on the real models.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


_SMALL_TAIL = 4
"""Query blocks of fewer rows than this take another matrix-product kernel (measured: 1-3 rows)."""
_CHECKED: dict[tuple[int, int, str], bool] = {}


def _block(rows: int) -> int:
    """Query rows per block in torch's CPU flash attention for ``rows`` query rows."""
    return 256 if rows >= 768 else 64 if rows >= 192 else 32


def _small_tail(rows: int) -> bool:
    return 0 < rows % _block(rows) < _SMALL_TAIL


def fold_is_exact(q: int, n: int) -> bool:
    """Whether ``q`` query rows per head, folded ``n`` heads deep, keep every row in a block of the same kind."""
    return not _small_tail(q) and not _small_tail(n * q)


def fold_checked(n: int, head_dim: int, dtype: Any) -> bool:
    """The fold rule holds on this machine for this grouping, head size and dtype (probed once per process:
    query lengths 2-160 and a sample up to 1,300, each the fold against the expanded computation)."""
    import torch

    key = (n, head_dim, str(dtype))
    if key not in _CHECKED:
        gen = torch.Generator().manual_seed(0)
        ok = True
        for q in [*range(2, 161), *range(161, 1300, 29)]:
            if not fold_is_exact(q, n):
                continue
            kv = q + 40
            # laid out as transformers hands them over: the query a transposed view, the expansion a copy
            query = torch.randn(1, q, n, head_dim, generator=gen).to(dtype).transpose(1, 2)
            k, v = (torch.randn(1, 1, kv, head_dim, generator=gen).to(dtype) for _ in range(2))
            mask = torch.ones(1, 1, q, kv, dtype=torch.bool).tril(kv - q)
            ref = torch.nn.functional.scaled_dot_product_attention(
                query, k.repeat_interleave(n, 1), v.repeat_interleave(n, 1), attn_mask=mask)
            out = _fold(query, k, v, mask, n, None)
            if not torch.equal(ref, out):
                ok = False
                break
        _CHECKED[key] = ok
    return _CHECKED[key]


def _fold(query: Any, key: Any, value: Any, mask: Any, n: int, scaling: float | None) -> Any:
    """[B, G*n, q, d] attention over [B, G, kv, d] with the n query heads of a KV head folded into the rows."""
    import torch

    B, H, q, d = query.shape
    G, kv = key.shape[1], key.shape[2]
    mb = mask.shape[0]
    folded = mask.expand(mb, 1, q, kv)[:, :, None].expand(mb, 1, n, q, kv).reshape(mb, 1, n * q, kv)
    out = torch.nn.functional.scaled_dot_product_attention(query.reshape(B, G, n * q, d), key, value,
                                                           attn_mask=folded, scale=scaling)
    return out.reshape(B, H, q, value.shape[-1])


def folded_gqa(original: Any) -> Any:
    """An attention function for transformers' ``sdpa`` slot: the fold where it applies, else ``original``."""

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                  scaling: float | None = None, is_causal: bool | None = None, position_bias: Any = None,
                  **kwargs: Any) -> tuple[Any, None]:
        n = int(getattr(module, "num_key_value_groups", 1) or 1)
        B, H, q, d = query.shape
        if (n > 1 and q > 1 and attention_mask is not None and attention_mask.dim() == 4
                and attention_mask.shape[1] == 1 and position_bias is None and not dropout
                and kwargs.get("softcap") is None and not kwargs.get("output_attentions")
                and query.device.type == "cpu" and key.shape[1] * n == H and fold_is_exact(q, n)
                and fold_checked(n, d, query.dtype)):
            out = _fold(query, key, value, attention_mask, n, scaling)
            return out.transpose(1, 2).contiguous(), None
        return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, position_bias=position_bias, **kwargs)

    attention.toolfid_folded = True  # type: ignore[attr-defined]
    return attention


@contextlib.contextmanager
def folded_gqa_attention() -> Iterator[None]:
    """Within this block, models whose attention is transformers' ``sdpa`` use :func:`folded_gqa`."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    except (ImportError, KeyError):  # another transformers: nothing to fold
        yield
        return
    if getattr(original, "toolfid_folded", False):  # already inside such a block
        yield
        return
    had_local = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping
    ALL_ATTENTION_FUNCTIONS["sdpa"] = folded_gqa(original)
    try:
        yield
    finally:
        if had_local:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = original
        else:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]
