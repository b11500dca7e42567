"""Views of one ``toolfid run``: the base view, then every adapter view, on one loaded model;
each view saved (results, samples, manifest) as soon as it finishes, and reused by ``--resume``
when its manifest matches."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lm_eval_toolfid.calibration.adapters import check_adapter

log = logging.getLogger("lm_eval.toolfid")


from lm_eval_toolfid.run.session import ModelSession
from lm_eval_toolfid.reporting.view_store import ViewResult, load_saved_view, view_manifest


def run_views(base: str, adapters: dict[str, str], task: str, metadata: dict[str, Any],
              batch_size: int | str = "auto", out_dir: Path | None = None,
              session: ModelSession | None = None,
              base_view: ViewResult | None = None, *, device: str | None = None, dtype: str | None = None,
              progress: Any = None, verbose: bool = True,
              resume: bool = False, limit: int | None = None) -> tuple[ViewResult, list[ViewResult]]:
    """Base view once, then every adapter view, all on one loaded model.

    ``session`` reuses an already loaded model whose ``default`` adapter is the first adapter;
    ``base_view`` reuses a base view that session already ran (its reference is in the store).
    ``resume`` (with ``out_dir``) reuses views already saved there with an identical manifest;
    when every view is saved, no model is loaded at all. ``limit``: the first cases of the task only.
    """
    for path in adapters.values():
        check_adapter(path, base)
    names = list(adapters)
    model_args = {"pretrained": base, **({"dtype": dtype} if dtype else {})}
    done: dict[str, ViewResult] = {}
    if resume and out_dir is not None:
        for label, adapter in [("base", None), *adapters.items()]:
            found = load_saved_view(out_dir, label, view_manifest(base, adapter, task, metadata, model_args, limit))
            if found is not None:
                done[label] = found
    if base_view is None and "base" in done:
        base_view = done["base"]
        if progress is not None:
            progress.view_skipped("base", f"reusing {base_view.path}")
    todo = [n for n in names if n not in done]
    for name in names:
        if name in done and progress is not None:
            progress.view_skipped(name, f"reusing {done[name].path}")
    if base_view is not None and not todo:
        return base_view, [done[n] for n in names]
    if session is None:
        session = ModelSession(base, adapters[names[0]], batch_size=batch_size, device=device, dtype=dtype,
                               progress=progress, verbose=verbose)
    for name in names[1:]:
        session.add_adapter(name, adapters[name])
    if base_view is None:
        base_view = evaluate_base(session, task, metadata, out_dir, limit=limit)
    views = []
    for i, name in enumerate(names):
        if name in done:
            views.append(done[name])
            continue
        session.activate("default" if i == 0 else name)
        views.append(session.evaluate(task, metadata, adapter=adapters[name], label=name, out_dir=out_dir,
                                      limit=limit))
    return base_view, views


def evaluate_base(session: ModelSession, task: str, metadata: dict[str, Any],
                  out_dir: Path | None = None, limit: int | None = None) -> ViewResult:
    """The base view (adapter disabled); it stores the reference adapter views pair with."""
    with session.base_view():
        return session.evaluate(task, metadata, adapter=None, label="base", out_dir=out_dir, limit=limit)
