"""``toolfid run --backend vllm``: the base and every adapter in ONE vLLM engine in this process.

The engine is lm-eval's own ``VLLM`` model (:mod:`~lm_eval_toolfid.integrations.vllm.model`) loaded once with
``enable_lora``; each view is an ordinary ``simple_evaluate`` of the task on it (:func:`~lm_eval_toolfid.run.views.
evaluate_view`, as every session), so scoring, pairing, samples and verdicts are those of ``toolfid run`` and of
``lm_eval --model vllm``. The views' requests go to the engine together, each with its adapter's ``LoRARequest``.

Each view records the model args an ``lm_eval --model vllm`` run would be given for it: ``pretrained``, ``dtype``,
``enable_lora=True``, ``max_lora_rank`` and every ``--vllm-arg``; adapter views add ``lora_local_path``. So the
base view's reference has the identity of the base run ``lm_eval --model vllm --model_args
pretrained=B,enable_lora=True,max_lora_rank=R,…``, and an ``lm_eval --model vllm`` adapter run given the same
arguments and ``lora_local_path=A`` pairs with it."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.reporting.view_store import ViewResult
from lm_eval_toolfid.calibration.nulls import CalibrationSpec, keep_null_view, make_nulls
from lm_eval_toolfid.calibration.posthoc import write_fit
from lm_eval_toolfid.run.plan import RunPlan, View, VllmOptions
from lm_eval_toolfid.run.views import evaluate_view

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""
DEFAULT_RANK = 16
"""lm-eval's ``VLLM`` default ``max_lora_rank`` (used when every adapter's rank fits it)."""
def adapter_rank(path: str) -> int:
    """The LoRA rank ``r`` an adapter folder's config records (0 where it records none)."""
    try:
        config = json.loads((Path(path) / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    ranks = [config.get("r")] + list((config.get("rank_pattern") or {}).values())
    return max((int(r) for r in ranks if isinstance(r, (int, float))), default=0)


def default_max_lora_rank(adapters: Sequence[str]) -> int:
    """lm-eval's default (16) where every adapter fits it, else the smallest rank vLLM accepts that fits all."""
    need = max((adapter_rank(p) for p in adapters), default=0)
    if need <= DEFAULT_RANK:
        return DEFAULT_RANK
    fits = [r for r in VLLM_RANKS if r >= need]
    if not fits:
        raise ToolfidError(f"an adapter has LoRA rank {need}; vLLM serves ranks up to {VLLM_RANKS[-1]}")
    return fits[0]


def view_model_args(base: str, options: VllmOptions, rank: int | None = None, adapter: str | None = None
                    ) -> dict[str, Any]:
    """The model args a view records (and ``lm_eval --model vllm`` would be given for it): ``pretrained``, ``dtype``
    (where given), every ``--vllm-arg``, ``enable_lora=True``, ``max_lora_rank``; an adapter view adds
    ``lora_local_path``."""
    args: dict[str, Any] = {"pretrained": base, **({"dtype": options.dtype} if options.dtype else {})}
    args.update(dict(options.engine_args))
    args["enable_lora"] = True
    args["max_lora_rank"] = int(rank if rank is not None else DEFAULT_RANK)
    return {**args, **({"lora_local_path": adapter} if adapter else {})}


class VllmSession:
    """One vLLM engine with every adapter of the run as a ``LoRARequest``: the vLLM
    :class:`~lm_eval_toolfid.run.runner.ViewSession` (the engine starts on the first view it runs)."""

    def __init__(self, base: str, options: VllmOptions, progress: Any = None, verbose: bool = True) -> None:
        from lm_eval_toolfid.integrations.vllm.model import require_vllm

        require_vllm()  # one line saying what to install, before anything loads
        # vLLM logs to stdout by default: it goes to stderr, so stdout stays the report (--json); INFO only with
        # --verbose (set before vLLM is first imported: it reads these once)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        if not verbose:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self.base, self.options = base, options
        self.progress, self.verbose = progress, verbose or progress is None
        self.lm: Any = None
        self._tmp: Any = None
        self._rank: int | None = dict(options.engine_args).get("max_lora_rank")

    @property
    def manifest_args(self) -> dict[str, Any]:
        """The model args every view runs with: what an ``lm_eval --model vllm`` base run with the same LoRA
        settings is given (its reference is this run's base view's)."""
        return view_model_args(self.base, self.options, self._rank)

    def check(self, plan: RunPlan) -> None:
        """Every adapter must be a LoRA of this base, within the engine's ``max_lora_rank``."""
        from lm_eval_toolfid.run.session import check_adapters, check_base

        check_base(self.base)
        check_adapters(plan.adapters.values(), plan.base)
        if self._rank is None:
            self._rank = default_max_lora_rank(list(plan.adapters.values()))
        too_big = {label: adapter_rank(p) for label, p in plan.adapters.items() if adapter_rank(p) > int(self._rank)}
        if too_big:
            label, rank = next(iter(too_big.items()))
            raise ToolfidError(f"adapter {label!r} has LoRA rank {rank} > max_lora_rank {self._rank}: pass "
                               f"--vllm-arg max_lora_rank={default_max_lora_rank([plan.adapters[label]])} (or leave "
                               "it out: toolfid picks one that fits)")

    def load(self, n_adapters: int, first_adapter: str | None = None) -> None:
        from lm_eval_toolfid.integrations.vllm.model import toolfid_vllm
        from lm_eval_toolfid.reporting.progress import quiet_lm_eval

        from lm_eval_toolfid.integrations.vllm.model import cpu_platform, zero_lora

        engine = {**self.manifest_args}
        zeros = cpu_platform()  # vLLM's CPU build computes a row without LoRA under the last resident one
        engine.setdefault("max_loras", max(1, min(n_adapters + int(zeros), 8)))  # resident at once; more swap in
        if self.progress is not None:
            self.progress.message(f"starting vLLM with {self.base} and {n_adapters} LoRA adapter(s)")
        with quiet_lm_eval(self.progress, self.verbose) if self.progress is not None else contextlib.nullcontext():
            self.lm = toolfid_vllm()(**engine)
        self.lm.show_bars = self.verbose and self.progress is not None and not self.progress.live
        if zeros and first_adapter is not None:
            self._tmp = tempfile.TemporaryDirectory(prefix="toolfid-vllm-")
            self.lm.base_lora = zero_lora(first_adapter, Path(self._tmp.name) / "base-zeros")
        if self.progress is not None:
            progress = self.progress
            self.lm.on_generated = lambda n, views, seconds: progress.message(
                f"vLLM generated {n} answers of {views} view(s) in one batch in {seconds:.1f} s")

    def view_args(self, view: View) -> dict[str, Any]:
        return view_model_args(self.base, self.options, self._rank, view.adapter)

    def evaluate(self, views: Sequence[View], plan: RunPlan) -> Iterator[ViewResult]:
        """Each view in order; the first to generate asks the engine for every view's answers at once (each under
        its own LoRA); answers are journaled per view (``OUT/.vllm/LABEL.jsonl``) until the caller saved it."""
        from lm_eval_toolfid.integrations.vllm.model import Journal

        if self.lm is None:
            if self._rank is None:
                self._rank = default_max_lora_rank(list(plan.adapters.values()))
            self.load(len(plan.adapters), next(iter(plan.adapters.values()), None))
        journal = Journal(plan.out_dir / ".vllm", self.manifest_args) if plan.out_dir is not None else None
        keys = {view.label: (view.label, view.adapter) for view in views}
        for view in views:
            known = journal.read(view.label, view.adapter) if journal is not None and plan.resume else {}
            if journal is not None and not known:
                journal.remove(view.label)  # another run's (or a stale) journal: start afresh
            self.lm.answers[view.label] = known
        if journal is not None:
            self.lm.journal = lambda label, got: journal.write(label, keys[label][1], got)
        self.lm.group = list(keys.values())
        try:
            for view in views:
                self.lm.view = keys[view.label]
                yield evaluate_view(self.lm, self.view_args(view), view, plan.task, plan.limit, self.progress,
                                    self.verbose)
                self.lm.answers.pop(view.label, None)
                self.lm.group.remove(keys[view.label])  # a finished view is not generated for again
                if journal is not None:
                    journal.remove(view.label)  # the saved view supersedes it
        finally:
            self.lm.group, self.lm.journal = [], None
            if journal is not None:
                with contextlib.suppress(OSError):
                    journal.folder.rmdir()  # only when no view's journal is left in it

    def calibrate(self, spec: CalibrationSpec, plan: RunPlan) -> None:
        """``--null-runs``, after the base view: null adapters shaped like the first adapter written as PEFT
        folders, run on the same engine (each a ``LoRARequest``, all in one batch) against the base reference,
        fitted into ``spec.out``."""
        nulls = make_nulls(spec, next(iter(plan.adapters.values())), self.base)
        self.fit_nulls(spec, nulls, plan, plan.metadata)

    def fit_nulls(self, spec: CalibrationSpec, nulls: list[Path], plan: RunPlan, metadata: Mapping[str, Any]) -> Any:
        views = [View(path.name, str(path), dict(metadata)) for path in nulls]
        results = []
        for result in self.evaluate(views, plan):
            keep_null_view(spec, result)  # each null's answers, as the HF session keeps them
            if self.progress is not None:
                self.progress.view_finished(result.label, len(result.samples))
            results.append(result.results)
        return write_fit(results, plan.task, spec.out)
