"""How many rows decode at once: ``auto`` sized from free memory and the model, halved on out-of-memory.

A decode batch's memory is its KV cache: ``2 x layers x kv_heads x head_dim x dtype bytes`` per
token, times each row's prompt + generation budget. :func:`auto_batch_size` fits as many rows of
the view as :data:`MEMORY_FRACTION` of the free memory holds (every row counted at the longest
row's length, so the bound is safe), after a reserve for the forward passes' activations and
logits; on CUDA that is usually the whole view, in one batch. On CPU the KV cache rarely binds
either, but decode throughput stops growing past a few dozen rows (the step becomes
compute-bound), so ``auto`` is capped at :data:`CPU_MAX_BATCH`.

:func:`halve_on_oom` runs a view and, when it runs out of memory, halves the batch (and the
prefill token budget) and runs it again, saying so in one line. The memory query
(:func:`free_memory`) is one function, so tests replace it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.engine.model_runner import base_model, text_config

log = logging.getLogger("lm_eval.toolfid")

T = TypeVar("T")

MEMORY_FRACTION = 0.7
"""Share of the free memory the decode batch's KV cache may take."""
CPU_MAX_BATCH = 64
"""``auto`` on CPU: decode rows at once. Decode throughput grows with the rows up to about this many; beyond
that the step is compute-bound and the KV cache grows for little gain (figures in docs/performance.md)."""
PREFILL_TOKENS = {"cuda": 16384, "cpu": 4096}
"""Padded tokens per prompt/verification forward pass, by device type (others: the CPU figure)."""
VERIFY_LOGITS = {"cuda": 1 << 30, "cpu": 64 * 1024 * 1024}
"""Logit values per verification pass after the first (rows x draft tokens x vocabulary), by device type, at
that device's :data:`PREFILL_TOKENS` (halved with it on out-of-memory). On a GPU a pass costs its launches more
than its arithmetic, so fewer, larger passes win (half the passes and a faster view than at the CPU figure;
figures in docs/performance.md); a card of less than 64 GiB gets 1/64 of its memory (:func:`verify_logits_for`).
On CPU the figure bounds memory."""


def free_memory(device: Any) -> int | None:
    """Free bytes on ``device`` (CUDA: the driver's free memory; CPU: MemAvailable), or None."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def kv_bytes_per_token(model: Any) -> int:
    """KV-cache bytes one token of one row takes in this model."""
    base, config = base_model(model), text_config(model)
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_attention_heads"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    dtype_bytes = next(base.parameters()).element_size()
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def activation_reserve(model: Any, prefill_tokens: int, verify_logits: int = VERIFY_LOGITS["cpu"]) -> int:
    """Bytes kept free for one forward pass of ``prefill_tokens`` tokens (MLP activations, logits)."""
    base, config = base_model(model), text_config(model)
    hidden = int(config.hidden_size)
    inner = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    dtype_bytes = next(base.parameters()).element_size()
    # a few live [tokens, inner] tensors in the MLP, plus the verification logits (bounded by the engine)
    return prefill_tokens * (4 * inner + 8 * hidden) * dtype_bytes + verify_logits * 4 + 4 * vocab * 64


def prefill_tokens_for(device: Any) -> int:
    import torch

    return PREFILL_TOKENS.get(torch.device(device).type, PREFILL_TOKENS["cpu"])


def verify_logits_for(device: Any, prefill_tokens: int | None = None) -> int:
    """Logit values per verification pass on ``device``: the device type's figure (on CUDA at most 1/64 of the
    card's memory in values, so a small card keeps its batch), scaled with a prefill budget other than the
    device's own (the out-of-memory halving halves both)."""
    import torch

    device = torch.device(device)
    full = VERIFY_LOGITS.get(device.type, VERIFY_LOGITS["cpu"])
    if device.type == "cuda":
        try:
            total = int(torch.cuda.get_device_properties(device).total_memory)
        except (RuntimeError, AssertionError, AttributeError, ValueError):  # no such card here: the figure
            total = None
        if total is not None:
            full = max(VERIFY_LOGITS["cpu"], min(full, total // 64))
    if prefill_tokens is None:
        return full
    return max(1, full * prefill_tokens // PREFILL_TOKENS.get(device.type, PREFILL_TOKENS["cpu"]))


def auto_batch_size(model: Any, device: Any, row_tokens: list[int], graphs: bool = False) -> int:
    """Rows to decode at once for a view whose rows need ``row_tokens`` (prompt + budget) each; ``graphs``: decode
    steps are captured (their memory counted per row: :func:`graph_bytes_per_row`)."""
    import torch

    n = max(1, len(row_tokens))
    kind = torch.device(device).type
    cap = n if kind != "cpu" else min(n, CPU_MAX_BATCH)
    fits = rows_in_memory(model, device, row_tokens)
    if graphs and fits:  # each row also pays its share of the captured steps' memory
        per_row = kv_bytes_per_token(model) * max(row_tokens or [1])
        fits = fits * per_row // (per_row + graph_bytes_per_row(model))
    return cap if fits is None else max(1, min(cap, fits))


def graph_bytes_per_row(model: Any) -> int:
    """What captured decode steps keep per row of their largest bucket: a step's activations (the graphs' memory
    pool is their own, not shared with the other passes) and its logits, float32 and the model's dtype."""
    base, config = base_model(model), text_config(model)
    hidden = int(config.hidden_size)
    inner = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    dtype_bytes = next(base.parameters()).element_size()
    return (4 * inner + 8 * hidden + vocab) * dtype_bytes + 4 * vocab


def rows_in_memory(model: Any, device: Any, row_tokens: list[int]) -> int | None:
    """Rows of ``row_tokens`` (prompt + budget) whose KV the free memory holds at once, beyond the reserve for one
    forward pass (no cap for throughput: :func:`auto_batch_size` applies that); None when the free memory is
    unknown."""
    free = free_memory(device)
    if free is None:
        return None
    per_row = kv_bytes_per_token(model) * max(row_tokens or [1])
    room = free * MEMORY_FRACTION - activation_reserve(model, prefill_tokens_for(device), verify_logits_for(device))
    return max(0, int(room // max(1, per_row)))


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of torch (CUDA, or the CPU allocator)."""
    import torch

    if isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "can't allocate memory" in text)


def halve_on_oom(run: Callable[[int, int], T], batch: int, device: Any,
                 prefill_tokens: int | None = None) -> tuple[T, int, int]:
    """``run(batch, prefill_tokens)``; on out-of-memory, half of both and again (one warning line each).

    Returns (result, the batch that ran, how many times it was halved). Raises a one-line
    :class:`ToolfidError` when even one row at a time does not fit."""
    import torch

    prefill = prefill_tokens or prefill_tokens_for(device)
    halvings = 0
    while True:
        try:
            return run(batch, prefill), batch, halvings
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled; anything else re-raised
            if not is_oom(exc):
                raise
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
            if batch <= 1 and prefill <= 256:
                raise ToolfidError(f"out of memory generating one row at a time on {device}: the model or the "
                                   "prompts are too large for this device (try --dtype bfloat16)") from None
            new_batch, new_prefill = max(1, batch // 2), max(256, prefill // 2)
            log.warning("toolfid: out of memory with batch %d on %s; running the view again with batch %d",
                        batch, device, new_batch)
            batch, prefill = new_batch, new_prefill
            halvings += 1
