"""What one ``toolfid run`` evaluates (:class:`RunPlan`), the models' options (:class:`ModelOptions` in process,
:class:`ServedOptions` against a server, :class:`VllmOptions` on one vLLM engine in process), its null calibration
(a :class:`~lm_eval_toolfid.calibration.nulls.CalibrationSpec`) and one view of it (:class:`View`): plain values,
decided once by the command line and read by the runner and the sessions (``--vllm-arg`` items are parsed for the
plan here: :func:`parse_engine_args`; the server's URL is resolved once: a
:class:`~lm_eval_toolfid.pairing.served.ServerURL`), checked before anything loads (:func:`check_model_options`:
``--dtype``, ``--device``). The output folder's checks and lock are :mod:`lm_eval_toolfid.run.output`'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from lm_eval_toolfid.calibration.nulls import CalibrationSpec
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.served import ServerURL
from lm_eval_toolfid.serving.connection import Connection


@dataclass(frozen=True)
class ModelOptions:
    """A base loaded in this process (``toolfid run`` without ``--server``)."""

    batch_size: int | str = "auto"
    device: str | None = None
    dtype: str | None = None
    views_together: int | None = None
    """At most this many views decode in one engine run (``--views-together``; None: as many as memory holds;
    1: one view at a time)."""
    revision: str | None = None
    """A hub base's revision (``--revision``: a branch, tag or commit), as lm-eval's ``revision=``: the base's
    identity records the commit it resolves to."""
    cuda_graphs: bool = False
    """Decode steps captured as CUDA graphs and replayed (``--cuda-graphs on``; a CUDA device only)."""


@dataclass(frozen=True)
class ServedOptions:
    """One OpenAI-compatible server and what every request to it shares (``toolfid run --server``).
    A new option is one field here, read by :meth:`model_args` (recorded with each view, part of its
    manifest) or :meth:`request_options` (how requests are sent, not what they ask)."""

    server: ServerURL
    """The server's URL, resolved by the plan (a malformed one fails there); model args record it as given."""
    api: str = "completions"
    tokenizer: str | None = None
    connection: Connection = field(default_factory=Connection)
    """How requests are sent: key, headers, timeouts, retries, rate-limit waits, concurrency (secrets never shown)."""

    def model_args(self) -> dict[str, Any]:
        return {"base_url": self.server.given, "api": self.api,
                **({"tokenizer": self.tokenizer} if self.tokenizer else {})}

    def request_options(self) -> dict[str, Any]:
        return {"connection": self.connection}


@dataclass(frozen=True)
class VllmOptions:
    """The base and every adapter in one vLLM engine in this process (``toolfid run --backend vllm``)."""

    dtype: str | None = None
    engine_args: tuple[tuple[str, Any], ...] = ()
    """``--vllm-arg KEY=VALUE`` in order (values typed as lm-eval types ``--model_args``): what the engine gets,
    and what each view records as its model args (so an ``lm_eval --model vllm`` run given the same arguments
    pairs with this run's base)."""


IN_PROCESS_ONLY = {"pretrained", "model", "lora_local_path", "enable_lora", "data_parallel_size"}
"""Engine args ``--vllm-arg`` does not take: set by the run itself, or (data parallel) not one engine."""


def parse_engine_args(items: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    """``--vllm-arg KEY=VALUE`` items, values typed as lm-eval types ``--model_args`` (``True``, ``4096``, ``0.9``)."""
    from lm_eval.utils import handle_arg_string

    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key or not value.strip():
            raise ToolfidError(f"--vllm-arg {item!r}: give KEY=VALUE, e.g. --vllm-arg tensor_parallel_size=2")
        if key in IN_PROCESS_ONLY:
            raise ToolfidError(f"--vllm-arg {key}: set by toolfid run itself (base: --base, adapters: --adapter, "
                               "LoRA always enabled; data parallel: run one toolfid per replica)")
        if key == "dtype":
            raise ToolfidError("--vllm-arg dtype: use --dtype")
        out[key] = handle_arg_string(value.strip())
    return tuple(out.items())


Models = Union[ModelOptions, ServedOptions, VllmOptions]
ENGINE_CHECK_LABEL = "base-again"


@dataclass(frozen=True)
class View:
    """One view: the base (``adapter`` None) or one adapter, and the task settings it runs with."""

    label: str
    adapter: str | None
    """An adapter folder in process, a served model name against a server."""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunPlan:
    """The base and every adapter to evaluate with one task, and how (``toolfid run``, ``toolfid demo``)."""

    base: str
    adapters: Mapping[str, str]
    """label -> adapter folder (in process) or served model name."""
    task: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    models: Models = field(default_factory=ModelOptions)
    out_dir: Path | None = None
    """Where each view is saved as it finishes (None: nothing is saved)."""
    limit: int | None = None
    resume: bool = False
    """Reuse the views already saved in ``out_dir`` with the same manifest."""
    calibration: CalibrationSpec | None = None
    """Null calibration between the base view and the adapter views (``--null-runs``)."""
    engine_check: bool = False
    """Run the base a second time after the other views and compare (``--engine-check``:
    :mod:`lm_eval_toolfid.scoring.engine_noise`)."""
    verbose: bool = True

    def base_view(self) -> View:
        return View("base", None, dict(self.metadata))

    def adapter_views(self) -> list[View]:
        """Every adapter view, with the plan's settings; with a null calibration, judged against it (its file in
        their settings)."""
        meta = dict(self.metadata)
        if self.calibration is not None:
            meta["calibration"] = str(self.calibration.out)
        return [View(label, adapter, meta) for label, adapter in self.adapters.items()]

    def engine_check_view(self) -> View:
        """The base again (``--engine-check``): its own label and journal, no reference written."""
        return View(ENGINE_CHECK_LABEL, None, {**self.metadata, "write_reference": False})

    def progress_labels(self) -> list[str]:
        """The views a progress display counts, in the order they run."""
        nulls = self.calibration.progress_labels() if self.calibration is not None else []
        return ["base", *nulls, *self.adapters, *([ENGINE_CHECK_LABEL] if self.engine_check else [])]


DTYPES = ("auto", "float32", "bfloat16", "float16")
"""What ``--dtype`` takes (lm-eval's HF and vLLM models read the name as torch's)."""


def check_model_options(models: Models) -> None:
    """``--dtype`` and ``--device`` checked before anything loads: an unknown dtype names the valid ones; a device
    this torch cannot use says why and what to do."""
    dtype = getattr(models, "dtype", None)
    if dtype is not None and dtype not in DTYPES:
        raise ToolfidError(f"--dtype {dtype!r} is not a dtype name: give one of {', '.join(DTYPES)}")
    device = getattr(models, "device", None) if isinstance(models, ModelOptions) else None
    if device:
        check_device(device)


def check_device(device: str) -> None:
    """``device`` names a device this torch has: one line otherwise (a CPU-only torch asked for CUDA is told so)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ToolfidError(f"--device {device!r} is not a torch device: give cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if torch.version.cuda is None and not getattr(torch.version, "hip", None):
            raise ToolfidError(f"--device {device}: this torch ({torch.__version__}) has no CUDA; install a CUDA "
                               "build (pip install torch --index-url https://download.pytorch.org/whl/cu124, the "
                               "index for your CUDA version: https://pytorch.org/get-started/locally/) or use "
                               "--device cpu")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ToolfidError(f"--device {device}: torch sees no CUDA device (driver, CUDA_VISIBLE_DEVICES?); "
                               "use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ToolfidError(f"--device {device}: torch sees {count} CUDA device(s) (cuda:0 to cuda:{count - 1})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ToolfidError(f"--device {device}: MPS is not available to this torch (Apple silicon, macOS 12.3+); "
                           "use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ToolfidError(f"--device {device}: toolfid runs on cpu, cuda or mps")
