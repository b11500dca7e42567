"""lm-eval's data-parallel gather put back in the cases' order.

lm-eval deals a task's documents to the ranks round robin (``islice(docs, rank, None, world_size)``) and gathers each
rank's samples and metric values to rank 0 rank by rank, so rank 0 sees the cases as ``0, 2, 4, …, 1, 3, 5, …``: the
samples file in another order than one process writes, and every float mean summed in another order (the last bit
of ``arg_disagreement`` moves). :func:`interleave_ranks` gives rank 0 what one process would have: every list dealt
back in document order, as the first rank's part, the others' parts emptied (lm-eval chains them)."""

from __future__ import annotations

from typing import Any


def interleave_ranks(parts: list[Any]) -> list[Any]:
    """``parts`` (one object per rank, as ``gather_object`` returns them) with every list merged round robin into
    the first part and the same keys emptied in the others; anything else is returned as it came."""
    if len(parts) < 2 or not _mergeable(parts):
        return parts
    return [_merge(parts), *(_emptied(part) for part in parts[1:])]


def _mergeable(parts: list[Any]) -> bool:
    if all(isinstance(p, list) for p in parts):
        return True
    if all(isinstance(p, dict) for p in parts):
        keys = set(parts[0])
        return all(set(p) == keys for p in parts) and all(_mergeable([p[k] for p in parts]) for k in keys)
    return False


def _merge(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {k: _merge([p[k] for p in parts]) for k in parts[0]}
    out = []
    for i in range(max(len(p) for p in parts)):
        out.extend(p[i] for p in parts if i < len(p))
    return out


def _emptied(part: Any) -> Any:
    if isinstance(part, dict):
        return {k: _emptied(v) for k, v in part.items()}
    return []
