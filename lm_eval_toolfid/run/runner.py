"""The views of one ``toolfid run``, whatever evaluates them: the base view, then (``--null-runs``) the
calibration stage, then every adapter view; each view saved (results, samples, manifest) as soon as it
finishes, and reused by ``--resume`` when its manifest matches (decided once, for every view and the calibration,
when the run starts: :func:`lm_eval_toolfid.run.resume.read_folder`'s one record, carried to the end).

A :class:`ViewSession` evaluates views: :class:`~lm_eval_toolfid.run.session.ModelSession` (a base loaded in
this process), :class:`~lm_eval_toolfid.run.served_session.ServedSession` (model names of one server) or
:class:`~lm_eval_toolfid.run.vllm_session.VllmSession` (one vLLM engine in this process). The
runner hands it a list of views and saves each result it yields before asking for the next, so a session may
run several views at once and yield them as they finish."""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

from lm_eval_toolfid.calibration.nulls import CalibrationSpec
from lm_eval_toolfid.reporting.progress import muted_logs
from lm_eval_toolfid.reporting.view_store import ViewResult, save_view
from lm_eval_toolfid.run import shards
from lm_eval_toolfid.run.plan import RunPlan, ServedOptions, View, VllmOptions
from lm_eval_toolfid.run.ranks import Ranks, barrier, from_main
from lm_eval_toolfid.run.resume import FolderState, keep_calibration, read_folder
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

    def calibrate(self, spec: CalibrationSpec, plan: RunPlan) -> None:
        """``--null-runs``, after the base view: the nulls run and fitted into ``spec.out`` (the adapter views that
        follow are judged against it: :meth:`RunPlan.adapter_views`). A session that cannot (it does not load the
        base) refuses in one line."""
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


def run_plan(plan: RunPlan, session: ViewSession | None = None, progress: Any = None,
             ranks: Ranks | None = None) -> tuple[ViewResult, list[ViewResult]]:
    """The base view and every adapter view of ``plan`` (``session`` default: :func:`open_session`'s); what
    needs no session was checked when the plan was made (``toolfid run``: a calibration's adapters,
    :func:`lm_eval_toolfid.calibration.adapters.check_shared_calibration`), what needs one is checked here, before any view runs.
    With ``plan.resume``, views (and a calibration) saved with the same manifest are reused; when every view is, no
    model is loaded at all. ``ranks`` (a launcher's: :mod:`lm_eval_toolfid.run.ranks`): every rank runs every view on
    its share of the cases; rank 0 reads the folder (every rank follows its decision) and saves."""
    ranks = ranks or Ranks()
    session = session or open_session(plan, progress)
    session.check(plan)
    # the folder asked once (by rank 0): what is done, what to do
    state = from_main(ranks, lambda: _read_folder(plan, session, progress))
    state.main = ranks.main
    store = _shards(plan, session, state, ranks, progress)
    base_view, adapter_views = plan.base_view(), plan.adapter_views()
    if plan.calibration is None or state.calibration_reused:  # every view at once: a session may decode them together
        todo = state.todo([base_view, *adapter_views])
    else:  # the nulls pair with the base view's reference, the adapter views are judged against their fit
        todo = state.todo([base_view])
        _evaluate(session, todo, plan, state, progress)
        session.calibrate(plan.calibration, plan)
        assert state.calibration is not None
        if state.main:
            keep_calibration(plan.calibration, state.calibration)
        barrier(ranks)  # the adapter views of every rank read the fit rank 0 has just written
        todo = state.todo(adapter_views)
    _evaluate(session, todo, plan, state, progress)
    base, adapters = state.done["base"], [state.done[label] for label in plan.adapters]
    if plan.engine_check:
        check_engine(session, plan, base, state, progress)
    if store is not None and ranks.main:  # every view saved: what the ranks kept is not needed any more
        store.remove()
    return base, adapters


def _read_folder(plan: RunPlan, session: ViewSession, progress: Any) -> FolderState:
    """:func:`read_folder`; a run that does not resume starts without an earlier run's shards."""
    if plan.out_dir is not None and not plan.resume:
        shards.clear(plan.out_dir)
    return read_folder(plan, session.manifest_args, progress)


def _shards(plan: RunPlan, session: ViewSession, state: FolderState, ranks: Ranks,
            progress: Any) -> shards.ShardStore | None:
    """Where this rank keeps each engine run's answers until their views are saved (a launcher's ranks), and reads
    those an interrupted run's ranks kept (``--resume``): :mod:`lm_eval_toolfid.run.shards`. None: a session that
    keeps none (served, vLLM: they refuse ranks), or no output folder."""
    use = getattr(session, "use_shards", None)
    if use is None or plan.out_dir is None or not (ranks.several or plan.resume):
        return None
    store = shards.ShardStore(plan.out_dir, {label: shards.manifest_digest(m) for label, m in state.manifests.items()},
                              ranks.rank, ranks.world, resume=plan.resume, write=ranks.several, progress=progress)
    use(store)
    return store


def check_engine(session: ViewSession, plan: RunPlan, base: ViewResult, state: FolderState,
                 progress: Any = None) -> EngineCheck:
    """``--engine-check``: the base run again, after every other view, compared with the first run case by case;
    written to ``OUT/engine_check.json`` (reused by ``--resume`` when the base view and its settings are the
    same)."""
    view = plan.engine_check_view()
    path = plan.out_dir / engine_noise.FILE if plan.out_dir is not None else None
    manifest = state.manifests[view.label]
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
    if path is not None and state.main:
        engine_noise.write_check(path, check, first, manifest)
    return check


def _evaluate(session: ViewSession, views: list[View], plan: RunPlan, state: FolderState, progress: Any) -> None:
    """Each view the session finishes, saved with its manifest before the next, and counted done."""
    if not views:
        return
    with muted_logs(progress is None or bool(getattr(session, "verbose", False))):
        for result in session.evaluate(views, plan):  # run to its end: a session tidies up after each saved view
            if plan.out_dir is not None and state.main:
                result.path = save_view(result, plan.out_dir, manifest=state.manifests[result.label])
            if progress is not None:
                progress.view_finished(result.label, len(result.samples))
            state.done[result.label] = result
