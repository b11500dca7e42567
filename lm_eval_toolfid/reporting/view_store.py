"""A saved view of ``toolfid run``: its lm-eval results, per-case samples (in lm-eval's samples
shape) and a manifest of what it was computed from; ``--resume`` reuses a view only when its
manifest matches."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger("lm_eval.toolfid")


MANIFEST = "manifest.json"
MANIFEST_FORMAT = "toolfid-view/1"

@dataclass
class ViewResult:
    """One view's lm-eval results (``results`` is lm-eval's dict, samples split off)."""

    label: str
    adapter: str | None
    results: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None

    def all_samples(self) -> list[dict[str, Any]]:
        """The samples: in memory, or (a view reused by ``--resume``) read back from ``samples.jsonl``."""
        if self.samples or self.path is None:
            return self.samples
        try:
            lines = (self.path.parent / "samples.jsonl").read_text(encoding="utf-8").splitlines()
            return [json.loads(line) for line in lines if line.strip()]
        except (OSError, ValueError):
            return []


def view_manifest(base: str, adapter: str | None, task: str, metadata: dict[str, Any],
                  model_args: dict[str, Any] | None = None, limit: int | None = None) -> dict[str, Any]:
    """What a saved view was computed from; ``--resume`` reuses a view only when all of it matches."""
    from lm_eval_toolfid import __version__
    from lm_eval_toolfid.pairing.identity import dir_fingerprint

    def fingerprint(path: str | None) -> str | None:
        if not path:
            return None
        p = Path(path).expanduser()
        return dir_fingerprint(p) if p.exists() else None

    return json.loads(json.dumps({
        "format": MANIFEST_FORMAT,
        "base": base, "base_fingerprint": fingerprint(base),
        "adapter": adapter, "adapter_fingerprint": fingerprint(adapter),
        # prefix_cache changes how tokens are computed, not which, and check_stops only checks them: a view saved
        # either way is reused; so is verify, except forced (true): in half precision a verified view's tokens can
        # differ at near ties from the decoded ones every other setting gives (integrations/lm_eval/verify_policy.py)
        "task": task, "settings": {k: v for k, v in metadata.items()
                                   if k not in ("verify", "check_stops", "prefix_cache")
                                   or (k == "verify" and v is True)},
        **({"limit": limit} if limit is not None else {}),
        "model_args": {k: v for k, v in (model_args or {}).items() if k != "pretrained"},
        "toolfid_version": __version__,
    }, sort_keys=True, default=str))


def lm_eval_sample_line(sample: dict[str, Any]) -> str:
    """One sample as ``lm_eval --log_samples`` writes it (``EvaluationTracker.save_results_samples``):
    ``arguments`` as ``{"gen_args_0": {"arg_0": prompt, "arg_1": gen_kwargs}}``, responses sanitised, the
    target as a string. Every reader of samples files then reads one shape."""
    from lm_eval.utils import handle_non_serializable, sanitize_list

    out = dict(sample)
    out["arguments"] = {f"gen_args_{i}": {f"arg_{j}": arg for j, arg in enumerate(args)}
                        for i, args in enumerate(sample.get("arguments") or [])}
    out["resps"] = sanitize_list(sample.get("resps", []))
    out["filtered_resps"] = sanitize_list(sample.get("filtered_resps", []))
    out["target"] = str(sample.get("target"))
    return json.dumps(out, default=handle_non_serializable, ensure_ascii=False) + "\n"


def save_view(view: ViewResult, out_dir: Path, manifest: dict[str, Any] | None = None) -> Path:
    """Write a view's results and samples at once, so nothing is lost if a later view fails.

    The manifest is written last: a view folder with a manifest is complete.
    """
    folder = view_folder(out_dir, view.label)
    atomic_write_text(folder / "samples.jsonl", "".join(lm_eval_sample_line(sample) for sample in view.samples))
    atomic_write_json(folder / "results.json", view.results)
    if manifest is not None:
        atomic_write_json(folder / MANIFEST, manifest)
    return folder / "results.json"


def view_folder(out_dir: Path, label: str) -> Path:
    """``out_dir/label``; a label that is not one folder name inside ``out_dir`` is refused in one line (nothing is
    ever written outside ``--output``)."""
    folder = out_dir / label
    if label in ("", ".", "..") or Path(label).name != label or "\\" in label or \
            folder.resolve().parent != Path(out_dir).resolve():
        raise ToolfidError(f"view label {label!r} would write outside {out_dir}: a label is one folder name")
    return folder


def read_manifest(out_dir: Path, label: str) -> dict[str, Any] | None:
    """The manifest saved in ``out_dir/label``, or None (no view saved there, or not readable)."""
    try:
        saved = json.loads((out_dir / label / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def load_saved_view(out_dir: Path, label: str, manifest: dict[str, Any]) -> ViewResult | None:
    """A finished view from an earlier run with the same manifest, else None (it must be run again)."""
    folder = out_dir / label
    try:
        saved = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if saved != manifest or not isinstance(results, dict) or not (folder / "samples.jsonl").is_file():
        return None
    if manifest.get("adapter") is None:  # adapter views pair with the reference this base view stored
        written = None
        for cfg in (results.get("configs") or {}).values():
            written = ((cfg or {}).get("metadata") or {}).get("toolfid", {}).get("reference_written") or written
        if not written or not Path(written).is_file():
            return None
    return ViewResult(label=label, adapter=manifest.get("adapter"), results=results, path=folder / "results.json")
