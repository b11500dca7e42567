"""A base model loaded once, with any number of adapters attached by name (:class:`ModelSession`).

Each view is an ordinary ``lm_eval.simple_evaluate`` call of the task on the one loaded model,
so per-case outcomes are exactly those of the two-run ``lm_eval`` CLI flow: the base view runs
with the adapter disabled (``PeftModel.disable_adapter``) and writes the base reference, like
``lm_eval ... pretrained=BASE``; each adapter view activates one adapter and pairs with that
reference, like ``lm_eval ... pretrained=BASE,peft=ADAPTER``. The base view's generated tokens
stay in the loaded model (:attr:`ToolfidHFLM.drafts`): adapter views verify them instead of
decoding them again (metadata ``verify: false`` turns that off).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

from lm_eval_toolfid.calibration.adapters import check_adapter
from lm_eval_toolfid.cases.bundled import tasks_path
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.reporting.view_store import ViewResult, save_view, view_manifest

log = logging.getLogger("lm_eval.toolfid")


def check_base(base: str) -> None:
    """A local base must be a model directory; anything path-like that does not exist is an error."""
    path = Path(base).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
            raise ToolfidError(f"base model directory {path} has no config.json")
        if (path / "config.json").is_file():
            from lm_eval_toolfid.calibration.adapters import read_json_object

            read_json_object(path / "config.json", "model config")
    elif path.exists():
        raise ToolfidError(f"base model {path} is a file, not a model directory")
    elif base.startswith(("/", ".", "~")) or base.count("/") > 1:
        raise ToolfidError(f"base model not found: {base}")


class ModelSession:
    """A base model loaded once, with any number of adapters attached by name."""

    def __init__(self, base: str, first_adapter: str, batch_size: int | str = "auto", device: str | None = None,
                 dtype: str | None = None, progress: Any = None, verbose: bool = True) -> None:
        from lm_eval_toolfid.reporting.progress import count_tokens, quiet_lm_eval
        from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

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
        """The adapter disabled; the tokens each case generates are kept as the drafts the adapter
        views of this session verify (``ToolfidHFLM.drafts``)."""
        self.lm.record_drafts = True
        try:
            with self.peft_model.disable_adapter():
                yield
        finally:
            self.lm.record_drafts = False

    def evaluate(self, task: str, metadata: dict[str, Any], adapter: str | None, label: str,
                 out_dir: Path | None = None, limit: int | None = None) -> ViewResult:
        """Run the task in the current view; ``adapter`` is what the task records as ``peft``; ``limit``: the
        first cases only (lm-eval's ``--limit``: a base view stores a subset reference)."""
        model_args = dict(self.model_args, **({"peft": adapter} if adapter else {}))
        manifest = view_manifest(self.base, adapter, task, metadata, self.model_args, limit)
        return evaluate_view(self.lm, model_args, task, metadata, label, adapter, out_dir, limit, manifest,
                             self.progress, self.verbose)


def evaluate_view(lm: Any, model_args: dict[str, Any], task: str, metadata: dict[str, Any], label: str,
                  adapter: str | None, out_dir: Path | None, limit: int | None, manifest: dict[str, Any],
                  progress: Any = None, verbose: bool = True) -> ViewResult:
    """One view: an ordinary ``simple_evaluate`` of the task on ``lm`` (model args and metadata reach the
    task as lm-eval's CLI passes them), saved under ``out_dir/label`` with its manifest."""
    import lm_eval.evaluator
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # lm-eval stamps results with the git hash of the *current directory* (and prints git's
    # "fatal: not a git repository" outside one); toolfid records its own provenance instead.
    lm_eval.evaluator.get_git_commit_hash = lambda: None

    from lm_eval_toolfid.reporting.progress import quiet_lm_eval

    meta = {**model_args, **metadata}
    if progress is not None:
        progress.view_started(label)
    with quiet_lm_eval(progress, verbose) if progress is not None else contextlib.nullcontext():
        manager = TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata=meta)
        out = simple_evaluate(model=lm, model_args=model_args, tasks=[task], task_manager=manager,
                              log_samples=True, bootstrap_iters=0, limit=limit)
    if out is None:
        raise ToolfidError("lm-eval returned no results")
    samples = out.pop("samples", {}).get(task, [])
    view = ViewResult(label=label, adapter=adapter, results=out, samples=samples)
    if out_dir is not None:
        view.path = save_view(view, out_dir, manifest=manifest)
    if progress is not None:
        progress.view_finished(label, len(samples))
    return view
