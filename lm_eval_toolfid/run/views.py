"""What every session shares: one view evaluated as an ordinary ``lm_eval.simple_evaluate`` of the task on an
lm-eval model (a base loaded in process, :mod:`~lm_eval_toolfid.run.session`; a served model,
:mod:`~lm_eval_toolfid.run.served_session`)."""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any, Callable

from lm_eval_toolfid.cases.bundled import tasks_path
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.reporting.view_store import ViewResult
from lm_eval_toolfid.run.plan import View


def _env_info_once(collect: Callable[[dict], None]) -> Callable[[dict], None]:
    """lm-eval's ``add_env_info(storage)``, run once per working directory (it records the git hash of the folder
    above it) and copied into every later ``storage``: the same keys and values lm-eval writes."""
    seen: dict[str, dict] = {}

    def add_env_info(storage: dict) -> None:
        where = os.getcwd()
        if where not in seen:
            first: dict = {}
            collect(first)
            seen[where] = first
        storage.update(copy.deepcopy(seen[where]))

    add_env_info._toolfid_once = True  # type: ignore[attr-defined]
    return add_env_info


@contextlib.contextmanager
def peers_lost(rank: int, world: int) -> Any:
    """A launcher's rank whose peers went away inside lm-eval's gather (a rank died): one line (exit 6), not the
    process group's traceback; what every rank finished is in the output folder's shards (``--resume``)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only the process group's own errors are turned into the line
        kind = type(exc).__name__
        if world <= 1 or not (kind.startswith("Dist") or "gloo" in str(exc).lower() or "nccl" in str(exc).lower()):
            raise
        from lm_eval_toolfid.run.ranks import RanksUnreachable

        raise RanksUnreachable(f"rank {rank} of {world} lost the other ranks ({kind}); the views saved and each rank's "
                               "finished answers are kept in --output: run again with --resume") from None


def evaluate_view(lm: Any, model_args: dict[str, Any], view: View, task: str, limit: int | None = None,
                  progress: Any = None, verbose: bool = True) -> ViewResult:
    """One view: an ordinary ``simple_evaluate`` of the task on ``lm`` (model args and ``view.metadata`` reach
    the task as lm-eval's CLI passes them); the caller saves it (and says it finished)."""
    import lm_eval.evaluator
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # lm-eval stamps results with the git hash of the *current directory* (and prints git's
    # "fatal: not a git repository" outside one); toolfid records its own provenance instead.
    lm_eval.evaluator.get_git_commit_hash = lambda: None
    # and with the environment (torch's collect_env: a `pip list` subprocess, ~0.3 s of CPU) once per view; it is
    # the same for every view of a run, so it is collected once per process and copied into each view's results
    if not getattr(lm_eval.evaluator.add_env_info, "_toolfid_once", False):
        lm_eval.evaluator.add_env_info = _env_info_once(lm_eval.evaluator.add_env_info)

    from lm_eval_toolfid.reporting.progress import quiet_lm_eval

    meta = {**model_args, **view.metadata}
    if progress is not None:
        progress.view_started(view.label)
    ranks = int(getattr(lm, "world_size", 1) or 1)
    with quiet_lm_eval(progress, verbose) if progress is not None else contextlib.nullcontext(), \
            peers_lost(int(getattr(lm, "rank", 0) or 0), ranks):
        manager = TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata=meta)
        out = simple_evaluate(model=lm, model_args=model_args, tasks=[task], task_manager=manager,
                              log_samples=True, bootstrap_iters=0, limit=limit)
    if ranks > 1:  # a launcher's ranks: rank 0 has written what the next view reads (the base reference) first
        lm.barrier()
    if out is None and ranks > 1 and getattr(lm, "rank", 0) != 0:  # its cases gathered to rank 0, which scores them
        return ViewResult(label=view.label, adapter=view.adapter, results={}, samples=[])
    if out is None:
        raise ToolfidError("lm-eval returned no results")
    samples = out.pop("samples", {}).get(task, [])
    if ranks > 1:  # gathered rank by rank: in the cases' order, as one process writes them
        samples.sort(key=lambda sample: sample.get("doc_id", 0))
        for sample in samples:  # lm-eval pads a shorter share by asking its last request again (one answer more)
            sample["resps"] = [list(r[:1]) if isinstance(r, list) else r for r in sample.get("resps", [])]
    return ViewResult(label=view.label, adapter=view.adapter, results=out, samples=samples)


def view_requests(lm: Any, model_args: dict[str, Any], view: View, task: str, limit: int | None = None,
                  progress: Any = None, verbose: bool = True) -> list[Any]:
    """The requests (lm-eval ``Instance``s, in task order) that :func:`evaluate_view` of ``view`` on ``lm`` will
    send, built by the task as ``simple_evaluate`` builds them: to ask them ahead, together with other views'. The
    task is told the backend ``lm`` is (``simple_evaluate`` would show it the model): the run's identity, and so
    the base reference it pairs with, depend on it."""
    from lm_eval.evaluator_utils import get_sample_size
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.integrations.lm_eval.task import backend_name
    from lm_eval_toolfid.reporting.progress import quiet_lm_eval

    with quiet_lm_eval(progress, verbose) if progress is not None else contextlib.nullcontext():
        manager = TaskManager(include_path=str(tasks_path()), include_defaults=False,
                              metadata={**model_args, **view.metadata, "backend": backend_name(lm)})
        built = manager.load([task])["tasks"][task]
        built.build_all_requests(limit=get_sample_size(built, limit), rank=0, world_size=1)
    return list(built.instances)
