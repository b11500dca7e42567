"""The engine's own noise (``toolfid run --engine-check``): the base generated twice with the same settings,
compared case by case. Greedy decoding on one engine should repeat itself; batched engines (vLLM, servers)
may not (batch composition, kernels chosen per batch). A case the engine moves by itself says nothing about
an adapter: where an adapter's output differs from the base's on such a case, the engine may be the cause.

Functions over lm-eval samples (``doc.id`` and ``filtered_resps``), and the file the run writes beside its views
(``OUT/engine_check.json``: :func:`write_check`) and the run's ``--resume`` and report read back (:func:`read_check`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

FILE = "engine_check.json"


def sample_texts(samples: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``case id -> generation`` of lm-eval samples (the first response of each)."""
    out: dict[str, str] = {}
    for sample in samples:
        try:
            text = sample["filtered_resps"][0]
            out[str(sample["doc"]["id"])] = text if isinstance(text, str) else str(text)
        except (KeyError, IndexError, TypeError):
            continue
    return out


def text_digest(texts: Mapping[str, str]) -> str:
    """A digest of ``case id -> generation``: a saved check belongs to the base run it compared."""
    return hashlib.sha256(json.dumps(texts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class EngineCheck:
    """The base asked twice: ``identical`` of ``n`` cases gave the same output; ``changed`` lists the others."""

    n: int
    identical: int
    changed: tuple[str, ...] = field(default_factory=tuple)

    @property
    def rate(self) -> float | None:
        return self.identical / self.n if self.n else None

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "identical": self.identical, "identical_rate": self.rate,
                "changed_cases": list(self.changed)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineCheck:
        return cls(int(data["n"]), int(data["identical"]), tuple(str(c) for c in data.get("changed_cases") or ()))


def compare_runs(first: Mapping[str, str], again: Mapping[str, str]) -> EngineCheck:
    """Case by case over the cases both runs answered (``sample_texts`` of each)."""
    common = sorted(set(first) & set(again))
    changed = tuple(c for c in common if first[c] != again[c])
    return EngineCheck(n=len(common), identical=len(common) - len(changed), changed=changed)


def read_check(path: Path, base_texts: Mapping[str, str],
               manifest: Mapping[str, Any] | None = None) -> EngineCheck | None:
    """The check saved at ``path`` when it compared this base run (``sample_texts`` of it) and, where given, was
    made with this manifest; None otherwise (absent, unreadable, another run's)."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("base_texts") != text_digest(base_texts):
            return None
        # compared as written (write_check's JSON: tuples as lists, paths as strings), or a vLLM run's engine args
        # would never match and --resume would run the check again
        if manifest is not None and saved.get("manifest") != json.loads(json.dumps(manifest, default=str)):
            return None
        return EngineCheck.from_dict(saved)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_check(path: Path, check: EngineCheck, base_texts: Mapping[str, str], manifest: Mapping[str, Any]) -> None:
    """``path``: the check, the manifest it was made with and the digest of the base run it compared."""
    from lm_eval_toolfid.core.fsutil import atomic_write_text

    atomic_write_text(path, json.dumps({"manifest": manifest, "base_texts": text_digest(base_texts),
                                        **check.to_dict()}, indent=2, default=str) + "\n")


def moved_by_engine(check: EngineCheck, adapter_samples: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """``(changed, of them moved by the engine)``: the cases whose output the adapter changed
    (``identical_output`` false in its pair record) and how many of those the engine changes by itself."""
    engine = set(check.changed)
    changed = moved = 0
    for sample in adapter_samples:
        record = sample.get("fidelity_pass") if isinstance(sample, Mapping) else None
        if not isinstance(record, Mapping) or record.get("identical_output") is not False:
            continue
        changed += 1
        moved += str((sample.get("doc") or {}).get("id")) in engine
    return changed, moved


def summary_line(check: EngineCheck) -> str:
    """One line for the screen."""
    if not check.n:
        return "engine check: no case was answered by both runs of the base"
    line = (f"engine check: the base run twice gave the same output on {check.identical}/{check.n} cases "
            f"({check.rate:.3f})")
    if check.identical == check.n:
        return line + ": the engine repeats itself; every change under an adapter is the adapter's"
    return (line + f"; the engine itself moves {check.n - check.identical} cases: on those, a change under an "
            "adapter may be the engine's, not the adapter's")


def adapter_note(check: EngineCheck, changed: int, moved: int) -> str | None:
    """The note an adapter's verdict gets where the engine moves cases (None where it does not)."""
    if check.identical == check.n or not changed:
        return None
    return (f"{moved} of the {changed} cases this adapter changed are cases the engine moves by itself "
            f"(engine check {check.identical}/{check.n}): the engine, not the adapter, moves those")
