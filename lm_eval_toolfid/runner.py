"""In-process evaluation: load the base once, run the task under several views.

Each view is an ordinary ``lm_eval.simple_evaluate`` call of the same task on one loaded
HFLM, so per-case outcomes are exactly those of the two-run ``lm_eval`` CLI flow:

- the base view runs with the adapter disabled (``PeftModel.disable_adapter``) and writes the
  base reference, like ``lm_eval ... pretrained=BASE``;
- each adapter view activates one adapter and pairs with that reference, like
  ``lm_eval ... pretrained=BASE,peft=ADAPTER``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .bundled import tasks_path
from .errors import ToolfidError
from .fsutil import atomic_write_json, atomic_write_text

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "toolfid-view/1"

log = logging.getLogger("lm_eval.toolfid")


@dataclass
class ViewResult:
    """One view's lm-eval results (``results`` is lm-eval's dict, samples split off)."""

    label: str
    adapter: str | None
    results: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None


def check_base(base: str) -> None:
    """A local base must be a model directory; anything path-like that does not exist is an error."""
    path = Path(base).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
            raise ToolfidError(f"base model directory {path} has no config.json")
        if (path / "config.json").is_file():
            from .adapter_check import read_json_object

            read_json_object(path / "config.json", "model config")
    elif path.exists():
        raise ToolfidError(f"base model {path} is a file, not a model directory")
    elif base.startswith(("/", ".", "~")) or base.count("/") > 1:
        raise ToolfidError(f"base model not found: {base}")


def check_adapter(adapter: str, base: str | None = None) -> None:
    """A broken adapter directory (or, given a local ``base``, one that does not fit it) is a
    one-line error before any model is loaded; see :mod:`lm_eval_toolfid.adapter_check`."""
    from .adapter_check import check_adapter as _check

    _check(adapter, base)


class ModelSession:
    """A base model loaded once, with any number of adapters attached by name."""

    def __init__(self, base: str, first_adapter: str, batch_size: int | str = 16, device: str | None = None,
                 dtype: str | None = None, progress: Any = None, verbose: bool = True) -> None:
        from .hflm import ToolfidHFLM
        from .reporting.progress import count_tokens, quiet_lm_eval

        check_base(base)
        check_adapter(first_adapter, base)
        self.base = base
        self.progress = progress
        self.verbose = verbose or progress is None
        import torch

        kwargs: dict[str, Any] = {"pretrained": base, "peft": first_adapter, "batch_size": batch_size,
                                  "device": device or ("cuda" if torch.cuda.is_available() else "cpu")}
        if dtype:
            kwargs["dtype"] = dtype
        if progress is not None:
            progress.message(f"loading {base} on {kwargs['device']}")
        with quiet_lm_eval(progress, self.verbose) if progress is not None else contextlib.nullcontext():
            self.lm = ToolfidHFLM(**kwargs)  # HFLM that stops each row at the end of its call
        if progress is not None:
            count_tokens(self.lm, progress)
        self.model_args = {"pretrained": base, **({"dtype": dtype} if dtype else {})}
        self.adapters: dict[str, str] = {"default": first_adapter}
        self.active = "default"

    @property
    def peft_model(self) -> Any:
        return self.lm.model

    def add_adapter(self, name: str, path: str) -> None:
        check_adapter(path, self.base)
        self.peft_model.load_adapter(path, adapter_name=name)
        self.adapters[name] = path

    def activate(self, name: str) -> None:
        self.peft_model.set_adapter(name)
        self.active = name

    @contextlib.contextmanager
    def base_view(self) -> Iterator[None]:
        with self.peft_model.disable_adapter():
            yield

    def evaluate(self, task: str, metadata: dict[str, Any], adapter: str | None, label: str,
                 out_dir: Path | None = None) -> ViewResult:
        """Run the task in the current view; ``adapter`` is what the task records as ``peft``."""
        import lm_eval.evaluator
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        # lm-eval stamps results with the git hash of the *current directory* (and prints git's
        # "fatal: not a git repository" outside one); toolfid records its own provenance instead.
        lm_eval.evaluator.get_git_commit_hash = lambda: None

        from .reporting.progress import quiet_lm_eval

        model_args = dict(self.model_args, **({"peft": adapter} if adapter else {}))
        meta = {**model_args, **metadata}
        if self.progress is not None:
            self.progress.view_started(label)
        with quiet_lm_eval(self.progress, self.verbose) if self.progress is not None else contextlib.nullcontext():
            manager = TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata=meta)
            out = simple_evaluate(model=self.lm, model_args=model_args, tasks=[task], task_manager=manager,
                                  log_samples=True, bootstrap_iters=0)
        if out is None:
            raise ToolfidError("lm-eval returned no results")
        samples = out.pop("samples", {}).get(task, [])
        view = ViewResult(label=label, adapter=adapter, results=out, samples=samples)
        if out_dir is not None:
            view.path = save_view(view, out_dir, manifest=view_manifest(self.base, adapter, task, metadata,
                                                                        self.model_args))
        if self.progress is not None:
            self.progress.view_finished(label, len(samples))
        return view


def view_manifest(base: str, adapter: str | None, task: str, metadata: dict[str, Any],
                  model_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a saved view was computed from; ``--resume`` reuses a view only when all of it matches."""
    from . import __version__
    from .pairing import dir_fingerprint

    def fingerprint(path: str | None) -> str | None:
        if not path:
            return None
        p = Path(path).expanduser()
        return dir_fingerprint(p) if p.exists() else None

    return json.loads(json.dumps({
        "format": MANIFEST_FORMAT,
        "base": base, "base_fingerprint": fingerprint(base),
        "adapter": adapter, "adapter_fingerprint": fingerprint(adapter),
        "task": task, "settings": metadata,
        "model_args": {k: v for k, v in (model_args or {}).items() if k != "pretrained"},
        "toolfid_version": __version__,
    }, sort_keys=True, default=str))


def save_view(view: ViewResult, out_dir: Path, manifest: dict[str, Any] | None = None) -> Path:
    """Write a view's results and samples at once, so nothing is lost if a later view fails.

    The manifest is written last: a view folder with a manifest is complete.
    """
    folder = out_dir / view.label
    atomic_write_text(folder / "samples.jsonl", "".join(
        json.dumps(sample, default=str, ensure_ascii=False) + "\n" for sample in view.samples))
    atomic_write_json(folder / "results.json", view.results)
    if manifest is not None:
        atomic_write_json(folder / MANIFEST, manifest)
    return folder / "results.json"


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


def run_views(base: str, adapters: dict[str, str], task: str, metadata: dict[str, Any],
              batch_size: int | str = 16, out_dir: Path | None = None,
              session: ModelSession | None = None,
              base_view: ViewResult | None = None, *, device: str | None = None, dtype: str | None = None,
              progress: Any = None, verbose: bool = True,
              resume: bool = False) -> tuple[ViewResult, list[ViewResult]]:
    """Base view once, then every adapter view, all on one loaded model.

    ``session`` reuses an already loaded model whose ``default`` adapter is the first adapter;
    ``base_view`` reuses a base view that session already ran (its reference is in the store).
    ``resume`` (with ``out_dir``) reuses views already saved there with an identical manifest;
    when every view is saved, no model is loaded at all.
    """
    for path in adapters.values():
        check_adapter(path, base)
    names = list(adapters)
    model_args = {"pretrained": base, **({"dtype": dtype} if dtype else {})}
    done: dict[str, ViewResult] = {}
    if resume and out_dir is not None:
        for label, adapter in [("base", None), *adapters.items()]:
            found = load_saved_view(out_dir, label, view_manifest(base, adapter, task, metadata, model_args))
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
        base_view = evaluate_base(session, task, metadata, out_dir)
    views = []
    for i, name in enumerate(names):
        if name in done:
            views.append(done[name])
            continue
        session.activate("default" if i == 0 else name)
        views.append(session.evaluate(task, metadata, adapter=adapters[name], label=name, out_dir=out_dir))
    return base_view, views


def evaluate_base(session: ModelSession, task: str, metadata: dict[str, Any],
                  out_dir: Path | None = None) -> ViewResult:
    """The base view (adapter disabled); it stores the reference adapter views pair with."""
    with session.base_view():
        return session.evaluate(task, metadata, adapter=None, label="base", out_dir=out_dir)
