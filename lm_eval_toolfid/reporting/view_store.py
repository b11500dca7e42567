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
CHECKS = ("check_stops", "prefix_cache")
"""Settings that change what a view checks (not its answers); part of its manifest, named apart."""
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
        # verify is left out except forced (true): in half precision a verified view's tokens can differ at near
        # ties from the decoded ones every other setting gives (integrations/lm_eval/verify_policy.py); the checks a
        # view ran (check_stops: its stop check; prefix_cache: which tokens were read from a shared prefix, counted
        # as near ties) are kept apart, so a resume asking for other checks runs them
        "task": task, "settings": {k: v for k, v in metadata.items()
                                   if k not in ("verify", *CHECKS) or (k == "verify" and v is True)},
        "checks": {k: metadata[k] for k in CHECKS if k in metadata},
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


FILES = "files"
"""The manifest's record of the view's files as saved (sha256 of each): ``--resume`` reuses a view only when its files
are still those bytes."""
SAVED_FILES = ("results.json", "samples.jsonl")


def _digest(path: Path) -> str:
    import hashlib

    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def save_view(view: ViewResult, out_dir: Path, manifest: dict[str, Any] | None = None) -> Path:
    """Write a view's results and samples at once, so nothing is lost if a later view fails.

    The manifest is written last, with the digests of both files: a view folder with a manifest is complete, and
    ``--resume`` can tell a file damaged or replaced since.
    """
    folder = view_folder(out_dir, view.label)
    atomic_write_text(folder / "samples.jsonl", "".join(lm_eval_sample_line(sample) for sample in view.samples))
    atomic_write_json(folder / "results.json", view.results)
    if manifest is not None:
        atomic_write_json(folder / MANIFEST, {**manifest, FILES: {name: _digest(folder / name) for name in SAVED_FILES}})
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
    """The manifest saved in ``out_dir/label`` (without its file digests), or None (no view saved there, or not
    readable)."""
    try:
        saved = json.loads((out_dir / label / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {k: v for k, v in saved.items() if k != FILES} if isinstance(saved, dict) else None


def saved_files_problem(folder: Path, results: dict[str, Any], digests: Any) -> str | None:
    """Why the view saved in ``folder`` cannot be trusted (None: its files are as saved and agree): each file still
    has the digest the manifest recorded, the samples parse, one per case, as many as the results counted."""
    if not isinstance(digests, dict) or set(digests) != set(SAVED_FILES):
        return "its manifest records no digests of its files (saved by an older version)"
    for name in SAVED_FILES:
        try:
            if _digest(folder / name) != digests[name]:
                return f"its {name} is not the file that was saved (damaged or replaced)"
        except OSError as exc:
            return f"its {name} cannot be read ({exc.strerror or exc})"
    ids = []
    try:
        for line in (folder / "samples.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                ids.append(str((json.loads(line).get("doc") or {}).get("id")))
    except (OSError, ValueError, AttributeError):
        return "its samples.jsonl does not parse"
    # the cases the task scored (its own count: lm-eval's n-samples "effective" is the last metric's count in 0.4.12)
    counted = [int(((cfg or {}).get("metadata") or {}).get("toolfid", {}).get("n_cases", -1))
               for cfg in (results.get("configs") or {}).values()
               if isinstance(((cfg or {}).get("metadata") or {}).get("toolfid", {}).get("n_cases"), int)]
    if len(set(ids)) != len(ids) or (counted and len(ids) != counted[0]) or not ids:
        return f"its samples.jsonl holds {len(ids)} cases ({len(set(ids))} distinct) where its results count " \
               f"{counted[0] if counted else '?'}"
    return None


def load_saved_view(out_dir: Path, label: str, manifest: dict[str, Any]) -> ViewResult | None:
    """A finished view from an earlier run with the same manifest, whose files are as saved, else None (it must be
    run again: :func:`why_not_reused` says why)."""
    return None if why_not_reused(out_dir, label, manifest) else ViewResult(
        label=label, adapter=manifest.get("adapter"), results=json.loads((out_dir / label / "results.json").read_text(
            encoding="utf-8")), path=out_dir / label / "results.json")


def why_not_reused(out_dir: Path, label: str, manifest: dict[str, Any]) -> str | None:
    """Why the view saved in ``out_dir/label`` is not reused with ``manifest`` (None: it is): no view saved, other
    settings, damaged files, or (a base view) a base reference that is gone or damaged."""
    from lm_eval_toolfid.pairing.references import read_reference

    folder = out_dir / label
    try:
        saved = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no complete view saved"
    if not isinstance(saved, dict) or {k: v for k, v in saved.items() if k != FILES} != manifest:
        return "its settings differ"
    try:
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        results = None
    problem = saved_files_problem(folder, results if isinstance(results, dict) else {}, saved.get(FILES))
    if problem is None and not isinstance(results, dict):
        problem = "its results.json does not parse"
    if problem:
        return problem
    if manifest.get("adapter") is None:  # adapter views pair with the reference this base view stored
        written = None
        for cfg in (results.get("configs") or {}).values():
            written = ((cfg or {}).get("metadata") or {}).get("toolfid", {}).get("reference_written") or written
        if not written or not Path(written).is_file():
            return "the base reference it wrote is gone"
        try:
            read_reference(Path(written))
        except ToolfidError:
            return f"the base reference it wrote ({written}) is damaged"
    return None
