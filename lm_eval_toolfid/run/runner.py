"""The views of one ``toolfid run``, whatever evaluates them: the base view, then (``--null-runs``) the
calibration stage, then every adapter view; each view saved (results, samples, manifest) as soon as it
finishes, and reused by ``--resume`` when its manifest matches (decided here, once, for every view): by content
(:func:`view_manifest_of`: the task and its file, the settings, a digest of the cases loaded after ``--limit``, the base's
and that adapter's weights, the model args). A view saved otherwise is computed again and the run says what changed
in one line; a base view computed again takes its adapter views with it (their old manifests removed first), so a
folder never mixes views of two case sets or two bases.

A :class:`ViewSession` evaluates views: :class:`~lm_eval_toolfid.run.session.ModelSession` (a base loaded in
this process), :class:`~lm_eval_toolfid.run.served_session.ServedSession` (model names of one server) or
:class:`~lm_eval_toolfid.run.vllm_session.VllmSession` (one vLLM engine in this process). The
runner hands it a list of views and saves each result it yields before asking for the next, so a session may
run several views at once and yield them as they finish."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Protocol, Sequence, Tuple

from lm_eval_toolfid.reporting.view_store import (MANIFEST, ViewResult, load_saved_view, read_manifest, save_view,
                                                  view_manifest)
from lm_eval_toolfid.calibration.nulls import CalibrationSpec
from lm_eval_toolfid.cases.bundled import tasks_path
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.run.plan import RunPlan, ServedOptions, View, VllmOptions
from lm_eval_toolfid.scoring import engine_noise
from lm_eval_toolfid.scoring.engine_noise import EngineCheck


class ViewSession(Protocol):
    """What evaluates the views of a run."""

    @property
    def manifest_args(self) -> dict[str, Any]:
        """The model args each saved view's manifest records (``--resume`` reuses a view only where they match)."""
        ...

    def check(self, plan: RunPlan) -> None:
        """Refuse, in one line, a plan whose models this session cannot evaluate (before any view runs)."""
        ...

    def calibrate(self, spec: CalibrationSpec, plan: RunPlan) -> Mapping[str, Any]:
        """``--null-runs``, after the base view: the nulls run and fitted; returns the settings of the adapter views
        that follow. A session that cannot (it does not load the base) refuses in one line."""
        ...

    def evaluate(self, views: Sequence[View], plan: RunPlan) -> Iterator[ViewResult]:
        """Each view (unsaved), in order, as it finishes. A base view (``adapter`` None) stores the reference the
        adapter views pair with, and whatever else they reuse (the base's tokens, to verify)."""
        ...


def open_session(plan: RunPlan, progress: Any = None) -> ViewSession:
    """The session the plan's models call for (a server contacted here: one that is down fails in one line)."""
    if isinstance(plan.models, ServedOptions):
        from lm_eval_toolfid.run.served_session import ServedSession

        return ServedSession(plan.base, plan.models, progress, plan.verbose)
    if isinstance(plan.models, VllmOptions):
        from lm_eval_toolfid.run.vllm_session import VllmSession

        return VllmSession(plan.base, plan.models, progress, plan.verbose)
    from lm_eval_toolfid.run.session import ModelSession

    return ModelSession(plan.base, plan.models, progress, plan.verbose)


def run_plan(plan: RunPlan, session: ViewSession | None = None,
             progress: Any = None) -> tuple[ViewResult, list[ViewResult]]:
    """The base view and every adapter view of ``plan`` (``session`` default: :func:`open_session`'s); what
    needs no session was checked when the plan was made (``toolfid run``: a calibration's adapters,
    :func:`lm_eval_toolfid.calibration.adapters.check_shared_calibration`), what needs one is checked here, before any view runs.
    With ``plan.resume``, views saved with the same manifest are reused; when every view is, no model
    is loaded at all."""
    session = session or open_session(plan, progress)
    session.check(plan)
    made_from = (session.manifest_args, content_digests(plan))  # what each view is computed from: --resume compares
    done = saved_views(plan, made_from, progress)
    if plan.calibration is None:  # every view at once: a session may decode them together
        todo = [view for view in [plan.base_view(), *plan.adapter_views()] if view.label not in done]
        ran = _evaluate(session, todo, plan, made_from, progress) if todo else []
        done.update({result.label: result for result in ran})
        base, adapters = done["base"], [done[label] for label in plan.adapters]
    else:
        base = done.get("base") or _evaluate(session, [plan.base_view()], plan, made_from, progress)[0]
        metadata: Mapping[str, Any] = session.calibrate(plan.calibration, plan)
        todo = [view for view in plan.adapter_views(metadata) if view.label not in done]
        ran = {result.label: result for result in _evaluate(session, todo, plan, made_from, progress)} if todo else {}
        adapters = [done.get(label) or ran[label] for label in plan.adapters]
    if plan.engine_check:
        check_engine(session, plan, base, made_from, progress)
    return base, adapters


def check_engine(session: ViewSession, plan: RunPlan, base: ViewResult, made_from: MadeFrom,
                 progress: Any = None) -> EngineCheck:
    """``--engine-check``: the base run again, after every other view, compared with the first run case by case;
    written to ``OUT/engine_check.json`` (reused by ``--resume`` when the base view and its settings are the
    same)."""
    view = plan.engine_check_view()
    path = plan.out_dir / engine_noise.FILE if plan.out_dir is not None else None
    manifest = view_manifest_of(plan, view, made_from)
    first = engine_noise.sample_texts(base.all_samples())
    saved = engine_noise.read_check(path, first, manifest) if plan.resume and path is not None else None
    if saved is not None:
        if progress is not None:
            progress.view_skipped(view.label, f"reusing {path}")
        return saved
    again = list(session.evaluate([view], plan))[0]  # to its end: the session tidies up after the view
    if progress is not None:
        progress.view_finished(view.label, len(again.samples))
    check = engine_noise.compare_runs(first, engine_noise.sample_texts(again.samples))
    if path is not None:
        engine_noise.write_check(path, check, first, manifest)
    return check


def _evaluate(session: ViewSession, views: list[View], plan: RunPlan, made_from: MadeFrom,
              progress: Any) -> list[ViewResult]:
    """Each view the session finishes, saved with its manifest before the next."""
    by_label, out = {view.label: view for view in views}, []
    for result in session.evaluate(views, plan):  # run to its end: a session tidies up after each saved view
        if plan.out_dir is not None:
            manifest = view_manifest_of(plan, by_label[result.label], made_from)
            result.path = save_view(result, plan.out_dir, manifest=manifest)
        if progress is not None:
            progress.view_finished(result.label, len(result.samples))
        out.append(result)
    return out


# --- --resume by content ---------------------------------------------------------------------------------------

CHANGES = (("cases_digest", "the cases"), ("limit", "--limit"), ("task", "the task"),
           ("task_config", "the task's file (prompt and generation settings)"), ("settings", "the settings"),
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


def cases_digest(plan: RunPlan) -> str | None:
    """A digest of the cases the run's views score: the case file the settings name (else the task's own), its
    first ``--limit`` cases (lm-eval's ``--limit`` takes the first N docs, in file order), as written (a case edited
    in place, even its formatting, is another case set). None when the cases cannot be found here (a task from
    elsewhere): the manifest then keys them by name only."""
    from lm_eval_toolfid.cases.load import resolve_cases_path

    spec = plan.metadata.get("cases")
    if spec is None:
        path = task_file(plan.task)
        found = re.search(r"^\s+cases:\s*(\S+)\s*$", path.read_text(encoding="utf-8"), re.M) if path else None
        if found is None:
            return None
        spec = found.group(1).strip("'\"")
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
        found = load_saved_view(plan.out_dir, view.label, manifest)
        if found is not None:
            done[view.label] = found
            continue
        saved = read_manifest(plan.out_dir, view.label)
        if saved is not None:
            changed[view.label] = f"{what_changed(saved, manifest)} changed since it was saved"
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
