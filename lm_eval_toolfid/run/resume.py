"""``--resume`` by content, decided in one place: :func:`read_folder` reads the output folder once when a run
starts and gives the runner one record (:class:`FolderState`): the manifest every view of the run is saved with
(:func:`view_manifest_of`: the task and its file, the settings, a digest of the cases loaded after ``--limit``, the
base's and that adapter's weights, the model args, the checks), the views it reuses (their files checked against
their manifest), and whether the null calibration (``--null-runs``) is reused. A view saved otherwise is computed
again and the run says what changed in one line; a base view computed again takes its adapter views (and the
calibration) with it, their old manifests removed first, and a calibration computed again takes the adapter views
judged against it: a folder never mixes views of two case sets, two bases or two calibrations."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Tuple

from lm_eval_toolfid.calibration.nulls import CalibrationSpec
from lm_eval_toolfid.cases.bundled import tasks_path
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_json
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


@dataclass
class FolderState:
    """What this run's output folder already holds that the run reuses, read once by :func:`read_folder`: the
    runner carries it from the first view to the engine check, and nothing else asks the folder."""

    manifests: dict[str, dict[str, Any]]
    """Every view of the run (base, adapters, the engine check) -> the manifest it is saved with."""
    done: dict[str, ViewResult] = field(default_factory=dict)
    """The views reused (label -> result read back)."""
    calibration: dict[str, Any] | None = None
    """``--null-runs``: what the calibration is made from (its manifest); None without one."""
    calibration_reused: bool = False
    main: bool = True
    """This process saves what it computes (rank 0 of a launcher's, or the only one)."""

    def todo(self, views: Iterable[View]) -> list[View]:
        """The views of ``views`` still to compute."""
        return [view for view in views if view.label not in self.done]


def read_folder(plan: RunPlan, manifest_args: dict[str, Any], progress: Any = None) -> FolderState:
    """The run's :class:`FolderState`: the manifests of every view (``manifest_args``: the session's model args),
    and with ``--resume`` the views saved with the same manifest whose files are as saved, and the calibration when
    it was made from the same base view, first adapter and settings; each view (or calibration) saved otherwise is
    named with what changed. No adapter view is reused when the base view or the calibration is not."""
    made_from = (manifest_args, content_digests(plan))
    views = [plan.base_view(), *plan.adapter_views(), *([plan.engine_check_view()] if plan.engine_check else [])]
    state = FolderState({view.label: view_manifest_of(plan, view, made_from) for view in views})
    if plan.calibration is not None:
        state.calibration = calibration_manifest(plan, state.manifests)
    if not plan.resume or plan.out_dir is None:
        return state
    views = views[:1 + len(plan.adapters)]  # the engine check is read after the base view (it compares with it)
    changed: dict[str, str] = {}
    for view in views:
        manifest = state.manifests[view.label]
        why = why_not_reused(plan.out_dir, view.label, manifest)
        if why is None:
            found = load_saved_view(plan.out_dir, view.label, manifest)
            if found is not None:
                state.done[view.label] = found
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
    if plan.calibration is not None and "base" in state.done:
        why_not = why_calibration_not_reused(plan.calibration, state.calibration)
        state.calibration_reused = why_not is None
        if why_not is not None and why_not != "none saved" and progress is not None:
            progress.message(f"--resume: the calibration is computed again: {why_not}")
    again = None if "base" in state.done else "the base view is computed again"
    if again is None and plan.calibration is not None and not state.calibration_reused:
        again = "the calibration it is judged against is computed again"
    if again is not None:
        for view in views[1:]:  # paired with a base (or judged against a calibration) this run does not keep
            if view.label in state.done:
                changed[view.label] = again
                del state.done[view.label]
            _forget(plan.out_dir, view.label)
    for view in views:
        if progress is None:
            continue
        if view.label in state.done:
            progress.view_skipped(view.label, f"reusing {state.done[view.label].path}")
        elif view.label in changed:
            progress.message(f"--resume: {view.label} is computed again: {changed[view.label]}")
    if state.calibration_reused and progress is not None:
        for label in plan.calibration.progress_labels():
            progress.view_skipped(label, f"reusing {plan.calibration.out}")
    return state


# --- the calibration of ``--null-runs`` ----------------------------------------------------------

CALIBRATION_MANIFEST = "calibration.manifest.json"
"""Beside a run's ``calibration.json``: what it was made from, and the digest of every file it wrote."""


def calibration_manifest(plan: RunPlan, manifests: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """What a run's null calibration is made from: the base view (its manifest), the adapter the nulls are shaped
    like (the first), the number of nulls, seed and multipliers."""
    spec = plan.calibration
    assert spec is not None
    first = manifests[next(iter(plan.adapters))]
    return json.loads(json.dumps({"base_view": manifests["base"], "like": first["adapter"],
                                  "like_fingerprint": first["adapter_fingerprint"], "runs": spec.runs,
                                  "seed": spec.seed, "multipliers": list(spec.multipliers)}, sort_keys=True))


def _calibration_files(spec: CalibrationSpec) -> list[Path]:
    """The files a calibration writes: the fit and each null's answers."""
    return [spec.out, *(spec.samples_folder / f"{label}.jsonl" for label in spec.progress_labels())]


def keep_calibration(spec: CalibrationSpec, made_from: dict[str, Any]) -> None:
    """After the fit is written: its manifest, with the digest of each file, written last (a calibration without
    one is incomplete)."""
    digests = {str(path.relative_to(spec.out.parent)): _sha256(path) for path in _calibration_files(spec)}
    atomic_write_json(spec.out.parent / CALIBRATION_MANIFEST, {**made_from, "files": digests})


def why_calibration_not_reused(spec: CalibrationSpec, wanted: dict[str, Any] | None) -> str | None:
    """Why the calibration saved beside ``spec.out`` is not reused (None: it is): none saved, made from something
    else, or a file damaged or gone since (the fit is the file written after it loaded)."""
    try:
        saved = json.loads((spec.out.parent / CALIBRATION_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "none saved"
    if not isinstance(saved, dict):
        return "its manifest does not parse"
    if {k: v for k, v in saved.items() if k != "files"} != wanted:
        named = [words for key, words in (("base_view", "the base view"), ("like", "the first adapter"),
                                          ("like_fingerprint", "the first adapter's weights"), ("runs", "--null-runs"),
                                          ("seed", "--seed"), ("multipliers", "the multipliers"))
                 if saved.get(key) != (wanted or {}).get(key)]
        return f"{', '.join(named) or 'its settings'} changed since it was made"
    files = saved.get("files")
    for path in _calibration_files(spec):
        name = str(path.relative_to(spec.out.parent))
        try:
            if not isinstance(files, dict) or _sha256(path) != files.get(name):
                return f"its {name} is not the file that was saved (damaged or replaced)"
        except OSError as exc:
            return f"its {name} cannot be read ({exc.strerror or exc})"
    return None


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _forget(out_dir: Path, label: str) -> None:
    """A saved view that must be computed again loses its manifest now (a view folder without one is incomplete):
    stopped again before it is saved, the folder still holds no view of the old base a later resume could reuse."""
    (out_dir / label / MANIFEST).unlink(missing_ok=True)
