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
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from lm_eval_toolfid.calibration.adapters import check_adapter, check_engine_adapter
from lm_eval_toolfid.core.errors import REVISION_HINT, ToolfidError, offline, one_line
from lm_eval_toolfid.core.flags import parse_flag
from lm_eval_toolfid.reporting.view_store import ViewResult
from lm_eval_toolfid.calibration.nulls import CalibrationSpec, keep_null_view, make_nulls
from lm_eval_toolfid.calibration.posthoc import write_fit
from lm_eval_toolfid.run.plan import ModelOptions, RunPlan, View
from lm_eval_toolfid.run.views import evaluate_view

if TYPE_CHECKING:
    from lm_eval_toolfid.calibration.fit import Calibration
    from lm_eval_toolfid.integrations.lm_eval.joint import JointRun

log = logging.getLogger("lm_eval.toolfid")


def check_base(base: str, revision: str | None = None, gguf: bool = False) -> None:
    """A local base must be a model directory; anything path-like that does not exist is an error; a hub id must
    be in the local cache when ``HF_HUB_OFFLINE`` forbids downloading it (``gguf``: its config is not a file to
    look for)."""
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
    elif offline() and not gguf:
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(base, "config.json", revision=revision)
        except Exception:  # noqa: BLE001 - an id the hub would refuse: loading says why
            return
        if not isinstance(cached, str):
            raise ToolfidError(f"base model {base} is not in the local Hugging Face cache"
                               f"{f' at revision {revision}' if revision else ''} and HF_HUB_OFFLINE=1 forbids "
                               "downloading it: give a local model folder, unset HF_HUB_OFFLINE to download it, or "
                               f"pass the revision you have cached ({REVISION_HINT})")


@contextlib.contextmanager
def unreadable_weights(where: str) -> Iterator[None]:
    """A weights file safetensors cannot read (corrupt past its header) is an input error in one line, not a bug."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only safetensors' own error is turned into one line
        if type(exc).__name__ != "SafetensorError":
            raise
        raise ToolfidError(f"the weights of {where} cannot be read ({one_line(str(exc), 200)}): the file is corrupt; "
                           "copy or re-save it") from None


class ModelSession:
    """A base model loaded once, with any number of adapters attached by name: the in-process
    :class:`~lm_eval_toolfid.run.runner.ViewSession` (the model loads on the first view it runs)."""

    def __init__(self, base: str, options: ModelOptions | None = None, progress: Any = None,
                 verbose: bool = True) -> None:
        self.base = base
        self.options = options or ModelOptions()
        self.progress = progress
        self.verbose = verbose or progress is None
        self.lm: Any = None
        self.adapters: dict[str, str] = {}
        """peft adapter name -> folder (the first adapter loaded is ``default``)."""
        self._names: dict[str, str] = {}
        """view label -> peft adapter name."""
        self.active = "default"
        self.shards: Any = None
        """Where the model keeps each engine run's answers until their views are saved (:meth:`use_shards`)."""

    def use_shards(self, store: Any) -> None:
        """A launcher's ranks, or ``--resume``: the loaded model keeps its answers in ``store`` and reads an
        interrupted run's back from it (:mod:`lm_eval_toolfid.run.shards`)."""
        self.shards = store
        if self.lm is not None:
            self.lm.shards = store

    @property
    def manifest_args(self) -> dict[str, Any]:
        """The model args every view runs with (and its manifest records)."""
        return {"pretrained": self.base, **({"dtype": self.options.dtype} if self.options.dtype else {}),
                **({"revision": self.options.revision} if self.options.revision else {})}

    def check(self, plan: RunPlan) -> None:
        """Every adapter of the plan must be an adapter of this base (before any view runs or is reused)."""
        check_adapters(plan.adapters.values(), plan.base, alone=getattr(plan.models, "views_together", None) == 1)

    def load(self, adapters: Mapping[str, str]) -> ModelSession:
        """Load the base with the first adapter (peft name ``default``) and attach the others under their labels."""
        from lm_eval_toolfid.reporting.progress import count_tokens, quiet_lm_eval
        from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

        check_base(self.base, self.options.revision)
        (first_label, first), *others = adapters.items()
        import torch

        kwargs: dict[str, Any] = {"pretrained": self.base, "peft": first, "batch_size": self.options.batch_size,
                                  "device": self.options.device or ("cuda" if torch.cuda.is_available() else "cpu")}
        if self.options.dtype:
            kwargs["dtype"] = self.options.dtype
        if self.options.revision:
            kwargs["revision"] = self.options.revision
        if self.options.cuda_graphs:
            kwargs["cuda_graphs"] = True
        progress = self.progress
        if progress is not None:
            progress.message(f"loading {self.base} on {kwargs['device']}")
        with unreadable_weights(f"{self.base} or {first}"), \
                quiet_lm_eval(progress, self.verbose) if progress is not None else contextlib.nullcontext():
            self.lm = ToolfidHFLM(**kwargs)  # HFLM that stops each row at the end of its call
        if progress is not None:
            count_tokens(self.lm, progress)
        self.lm.shards = self.shards
        self.adapters, self._names = {"default": first}, {first_label: "default"}
        for label, path in others:
            with unreadable_weights(path):
                self.lm.attach_adapter(label, path)  # read for the engine where it can: milliseconds, no PEFT walk
            self.adapters[label], self._names[label] = path, label
        if others:
            held = self.lm.adapter_memory()  # the gathered stack built before any batch is sized
            if held and progress is not None and self.verbose:
                progress.message(held)
        return self

    @property
    def peft_model(self) -> Any:
        return self.lm.model

    def activate(self, name: str) -> None:
        self.lm.activate(name)
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

    def evaluate(self, views: Sequence[View], plan: RunPlan) -> Iterator[ViewResult]:
        """Each view in order, the adapter it names active (the base view with the adapter disabled,
        recording drafts); loads the model first if no view ran yet. Views that may share an engine run do
        (:meth:`joint_run`): the first of them to generate computes the others' answers too."""
        if self.lm is None:
            self.load(plan.adapters)
        yield from self._views(views, plan.task, plan.limit)

    def _views(self, views: Sequence[View], task: str, limit: int | None = None) -> Iterator[ViewResult]:
        """:meth:`evaluate` on the loaded model: the adapter views (and a run's nulls) by their session names."""
        joint = self.joint_run(views)
        self.lm.joint = joint
        if joint is not None and self.progress is not None:
            self.progress.together = joint.groups  # its progress lines say what is decoded together
        try:
            for view in views:
                self.lm.view_label = view.label
                if joint is not None:
                    joint.current = view.label
                if view.adapter is None:
                    with self.base_view():
                        yield self.evaluate_current(view, task, limit)
                else:
                    self.activate(self._names[view.label])
                    yield self.evaluate_current(view, task, limit)
        finally:
            self.lm.joint = None
            self.lm.view_label = None

    def joint_run(self, views: Sequence[View]) -> JointRun | None:
        """The views decoded together (None: one at a time: a single view, ``--views-together 1``, the engine off,
        or adapters PEFT cannot mix in one batch, said once in the log)."""
        from lm_eval_toolfid.integrations.lm_eval.joint import JointRun, JointView

        most = self.options.views_together
        if len(views) < 2 or most == 1 or not self.lm.use_engine:
            return None
        names = [self._names[v.label] for v in views if v.adapter is not None]
        why = self.lm.joint_unsupported(names)
        if why is not None:
            log.warning("toolfid: views decoded one at a time: %s", why)
            return None
        members = []
        for view in views:
            setting = verify_setting(view.metadata.get("verify"))
            verifies = view.adapter is not None and self.lm.verify_choice(setting).verify
            members.append(JointView(view.label, None if view.adapter is None else self._names[view.label], setting,
                                     verifies))
        return JointRun(members, most)

    def evaluate_current(self, view: View, task: str, limit: int | None = None) -> ViewResult:
        """Run the task on the model as it is now (adapter active or disabled by the caller); ``view.adapter``
        is what the task records as ``peft``; ``limit``: the first cases only (lm-eval's ``--limit``: a base
        view stores a subset reference)."""
        model_args = dict(self.manifest_args, **({"peft": view.adapter} if view.adapter else {}))
        return evaluate_view(self.lm, model_args, view, task, limit, self.progress, self.verbose)

    def calibrate(self, spec: CalibrationSpec, plan: RunPlan) -> None:
        """``toolfid run --null-runs``, after the base view (the nulls pair with its reference): nulls of the plan's
        first adapter (this session's ``default``) run and fitted into ``spec.out`` (the model loaded first when a
        resumed run reused the base view)."""
        if self.lm is None:
            self.load(plan.adapters)
        self.calibrate_nulls(spec, next(iter(plan.adapters.values())), plan.task, plan.metadata)

    def calibrate_nulls(self, spec: CalibrationSpec, adapter: str, task: str,
                        metadata: Mapping[str, Any]) -> Calibration | None:
        """Nulls of ``adapter`` (this session's ``default`` adapter), each run after the base view, fitted."""
        nulls = make_nulls(spec, adapter, self.base)
        return self.fit_nulls(spec, nulls, task, metadata)

    def fit_nulls(self, spec: CalibrationSpec, nulls: list[Path], task: str,
                  metadata: Mapping[str, Any]) -> Calibration | None:
        """The nulls run against the base reference (the base view ran): read into the engine's store and decoded
        together as adapter views are, or, where a null cannot be stored, each one's weights swapped into the
        ``default`` adapter in turn (the real weights restored after). Each null's answers are kept in
        ``spec.samples_folder`` and the fit written to ``spec.out`` (by rank 0 of a launcher's ranks: None
        elsewhere)."""
        results: list[dict[str, Any]] = []
        if not self._nulls_together(spec, nulls, task, metadata, results):
            self._nulls_swapped(spec, nulls, task, metadata, results)
        return write_fit(results, task, spec.out) if self._main else None

    @property
    def _main(self) -> bool:
        """This process scores and writes (rank 0 of a launcher's ranks, or the only process)."""
        return int(getattr(self.lm, "rank", 0) or 0) == 0

    def _keep_null(self, spec: CalibrationSpec, view: ViewResult, results: list[dict[str, Any]]) -> None:
        """A null view done: its answers kept and its results counted (rank 0: the others' cases were gathered to
        it)."""
        if not self._main:
            return
        keep_null_view(spec, view)
        if self.progress is not None:
            self.progress.view_finished(view.label, len(view.samples))
        results.append(view.results)

    def _nulls_together(self, spec: CalibrationSpec, nulls: list[Path], task: str, metadata: Mapping[str, Any],
                        results: list[dict[str, Any]]) -> bool:
        """Every null read into the engine's store and run as the adapter views are (:meth:`_views`), each row
        computing its own null. False (nothing run) where a null cannot be stored."""
        labels = []
        try:
            for path in nulls:
                if not self.lm.attach_adapter(path.name, str(path), peft=False):
                    return False
                labels.append(path.name)
            self._names.update({label: label for label in labels})
            for view in self._views([View(path.name, str(path), dict(metadata)) for path in nulls], task):
                self._keep_null(spec, view, results)
            return True
        finally:
            self.lm.detach_adapters(labels)
            for label in labels:
                self._names.pop(label, None)
            self.activate("default")

    def _nulls_swapped(self, spec: CalibrationSpec, nulls: list[Path], task: str, metadata: Mapping[str, Any],
                       results: list[dict[str, Any]]) -> None:
        """Each null's weights swapped into the ``default`` adapter in turn, the real weights restored after."""
        from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
        from safetensors.torch import load_file

        self.activate("default")
        real = {k: v.detach().clone()
                for k, v in get_peft_model_state_dict(self.peft_model, adapter_name="default").items()}
        try:
            for path in nulls:
                state = load_file(str(path / "adapter_model.safetensors"))
                set_peft_model_state_dict(self.peft_model, state, adapter_name="default")
                self._keep_null(spec, self.evaluate_current(View(path.name, str(path), dict(metadata)), task), results)
        finally:
            set_peft_model_state_dict(self.peft_model, real, adapter_name="default")


def verify_setting(value: Any) -> bool | None:
    """A view's metadata ``verify`` as the task reads it (None: not given)."""
    return parse_flag(value, "verify")


def check_adapters(adapters: Iterable[str], base: str, alone: bool = False) -> None:
    """Every adapter a usable PEFT folder that fits ``base``, and one the run can evaluate as given (``alone``: each
    view runs by itself, ``--views-together 1``)."""
    for path in adapters:
        check_adapter(path, base)
        check_engine_adapter(path, base, alone)
