"""``--resume`` by content: the manifest each view is saved with (:func:`view_manifest_of`: the task and its file,
the settings, a digest of the cases loaded after ``--limit``, the base's and that adapter's weights, the model args),
and which saved views a run reuses (:func:`saved_views`). A view saved otherwise is computed again and the run says
what changed in one line; a base view computed again takes its adapter views with it (their old manifests removed
first), so a folder never mixes views of two case sets or two bases."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Dict, Tuple

from lm_eval_toolfid.cases.bundled import tasks_path
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.reporting.view_store import (MANIFEST, ViewResult, load_saved_view, read_manifest, view_manifest,
                                                   why_not_reused)
from lm_eval_toolfid.run.plan import RunPlan, View

CHANGES = (("cases_digest", "the cases"), ("limit", "--limit"), ("task", "the task"),
           ("task_config", "the task's file (prompt and generation settings)"), ("settings", "the settings"),
           ("checks", "the checks asked (--check-stops, --no-prefix-cache)"),
           ("base", "the base"), ("base_fingerprint", "the base's weights"), ("adapter", "the adapter"),
           ("adapter_fingerprint", "the adapter's weights"), ("model_args", "the model args"),
           ("toolfid_version", "the toolfid version"))
"""Manifest keys and what a change in each means, in the order a message names them."""


def task_file(task: str) -> Path | None:
    """The YAML file of a task of this package (``task: NAME``), or None."""
    for path in sorted(tasks_path().rglob("*.yaml")):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if re.search(rf"^task:\s*['\"]?{re.escape(task)}['\"]?\s*$", text, re.M):
            return path
    return None


_YAML_CASES = re.compile(r"""^\s+cases:\s*(?:"([^"]*)"|'([^']*)'|([^\s#'"]+))\s*(?:\#.*)?$""", re.M)


def yaml_cases(text: str) -> str | None:
    """The ``cases:`` setting of a task's YAML text (its metadata), quoted or not, a trailing comment allowed; None
    when it has none."""
    found = _YAML_CASES.search(text)
    return next((g for g in found.groups() if g is not None), None) if found else None


def cases_digest(plan: RunPlan) -> str | None:
    """A digest of the cases the run's views score: the case file the settings name (else the task's own), its
    first ``--limit`` cases (lm-eval's ``--limit`` takes the first N docs, in file order), as written (a case edited
    in place, even its formatting, is another case set). None when the cases cannot be found here (a task from
    elsewhere): the manifest then keys them by name only."""
    from lm_eval_toolfid.cases.load import resolve_cases_path

    spec = plan.metadata.get("cases")
    if spec is None:
        path = task_file(plan.task)
        spec = yaml_cases(path.read_text(encoding="utf-8")) if path else None
        if spec is None:
            return None
    try:
        data = resolve_cases_path(spec).read_bytes()
    except (OSError, ValueError, ToolfidError):  # the task's own check says what is wrong, in one line
        return None
    lines = [line.rstrip(b"\r") for line in data.split(b"\n")]
    cases = [line for line in lines if line.strip() and not line.lstrip().startswith(b"//")]
    h = hashlib.sha256()
    for line in cases[:plan.limit] if plan.limit is not None else cases:
        h.update(line.strip() + b"\n")
    return h.hexdigest()[:16]


def task_config_digest(task: str) -> str | None:
    path = task_file(task)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path is not None else None


MadeFrom = Tuple[Dict[str, Any], Dict[str, Any]]
"""What every view of a run is computed from besides its own settings: the session's model args, and
:func:`content_digests` (read once)."""


def content_digests(plan: RunPlan) -> dict[str, Any]:
    """The content a view's manifest keys besides names: the cases (after ``--limit``), the task's file."""
    found = {"cases_digest": cases_digest(plan), "task_config": task_config_digest(plan.task)}
    return {k: v for k, v in found.items() if v is not None}


def view_manifest_of(plan: RunPlan, view: View, made_from: MadeFrom) -> dict[str, Any]:
    """The manifest ``view`` is saved with, and that ``--resume`` compares."""
    manifest_args, content = made_from
    manifest = view_manifest(plan.base, view.adapter, plan.task, dict(view.metadata), manifest_args, plan.limit)
    if getattr(plan.models, "cuda_graphs", False):  # replayed decode steps: other kernels, near ties counted apart
        manifest["checks"] = {**manifest.get("checks", {}), "cuda_graphs": True}
    return {**manifest, **content}


def what_changed(saved: dict[str, Any], wanted: dict[str, Any]) -> str:
    """What differs between a saved manifest and this run's, in words (``the cases, the adapter's weights``)."""
    named = [words for key, words in CHANGES if saved.get(key) != wanted.get(key)]
    other = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k) and k not in dict(CHANGES))
    return ", ".join(named + other) or "its saved files (incomplete, or the base's reference is gone)"


def saved_views(plan: RunPlan, made_from: MadeFrom, progress: Any = None) -> dict[str, ViewResult]:
    """``--resume``: the views already saved in ``plan.out_dir`` with the manifest this run would write; each view
    saved otherwise is named with what changed. No adapter view is reused when the base view is not."""
    done: dict[str, ViewResult] = {}
    if not plan.resume or plan.out_dir is None:
        return done
    changed: dict[str, str] = {}
    views = [plan.base_view(), *plan.adapter_views()]
    for view in views:
        manifest = view_manifest_of(plan, view, made_from)
        why = why_not_reused(plan.out_dir, view.label, manifest)
        if why is None:
            found = load_saved_view(plan.out_dir, view.label, manifest)
            if found is not None:
                done[view.label] = found
                continue
        saved = read_manifest(plan.out_dir, view.label)
        if saved is not None and saved != manifest:
            changed[view.label] = f"{what_changed(saved, manifest)} changed since it was saved"
        elif saved is not None:
            changed[view.label] = str(why)
    if "base" in changed:  # the folder's other views were compared with the base view about to be replaced
        ours = {view.label for view in views}
        strays = sorted(p.parent.name for p in plan.out_dir.glob(f"*/{MANIFEST}") if p.parent.name not in ours)
        if strays:
            raise ToolfidError(f"--resume: the base view is computed again ({changed['base']}), and {plan.out_dir} "
                               f"also holds views this run does not compute, compared with the old base: "
                               f"{', '.join(strays)}; name them with --adapter to compute them again, or move them "
                               "out of the folder")
    if "base" not in done:
        for view in views[1:]:  # paired with a base this run does not keep: computed again, never mixed
            if view.label in done:
                changed[view.label] = "the base view is computed again"
                del done[view.label]
            _forget(plan.out_dir, view.label)
    for view in views:
        if progress is None:
            continue
        if view.label in done:
            progress.view_skipped(view.label, f"reusing {done[view.label].path}")
        elif view.label in changed:
            progress.message(f"--resume: {view.label} is computed again: {changed[view.label]}")
    return done


def _forget(out_dir: Path, label: str) -> None:
    """A saved view that must be computed again loses its manifest now (a view folder without one is incomplete):
    stopped again before it is saved, the folder still holds no view of the old base a later resume could reuse."""
    (out_dir / label / MANIFEST).unlink(missing_ok=True)
