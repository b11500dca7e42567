#!/usr/bin/env python
"""Benchmark: where a base view's time goes, step by step.

SmolLM2-135M-Instruct's base view of the default cases as ``toolfid run`` generates it (plain-v3, one
demonstration: what ``auto`` picks for it; the task's ``until`` and budget; :class:`RowStopper` with the
primer; every row in one batch unless ``--batch``), through the engine, with each decode step split into:

- **forward**: the model's forward call (on CUDA: the host's time to launch it; ``device`` is the span CUDA
  events measure around it, and the profile the kernels' own time);
- **pick**: argmax / top-two gaps and the one ``.tolist()`` (on CUDA it waits for the device here);
- **take**: :func:`take_token` for every row (near ties, the stop rules: ``RowStopper.push``);
- **release**: finished rows' slots taken by the last live rows; **trim**: columns no live row uses dropped;
- **open**: the step's cache and mask (views of the slot buffers);
- **rest**: the rest of ``DecodeBatch.step`` (the step's input ids and positions, the loop);

plus admission (prompt passes; its forward passes apart) and joining the decode batch. With ``--cuda-graphs`` the
decode steps are captured once per bucket of live rows and replayed (``forward`` is then the replay's host time;
captures are timed apart): the run prints steps replayed against steps launched op by op, host ms per step and the
captures' time and memory. The engine has no timing
hooks, so these parts are timed by wrapping the engine's methods that do them (:data:`SEAMS`); where the engine no
longer has one of them, the benchmark stops and names it rather than leave that part out. Prints steps, live rows
per step (quantiles, and steps and time by live rows: the tail one long row keeps alive), and per-step host time.
``--profile`` adds a ``torch.profiler`` summary of the last run (top ops by device and host time, kernel launches
per decode step). ``--tokens-out`` / ``--tokens-ref`` write / compare every row's tokens (an engine change must
not move one). ``--json-out`` writes each run's figures (wall, steps replayed and launched, host ms per step, captures'
time and memory) and the token comparison as one JSON object (bench/device_issue55.sh reads it).

    OMP_NUM_THREADS=2 nice .venv/bin/python bench/gpu_base_pace.py --cases 24                 # CPU, small
    python bench/gpu_base_pace.py --model /tmp/smollm2 --profile                               # one GPU, bfloat16
    python bench/gpu_base_pace.py --model /tmp/smollm2 --cuda-graphs --tokens-ref eager.json   # replayed steps

On the GPU machine (no registry: ``../shared/gpu.md``) pass the converted folder as ``--model``, or
``--gguf SmolLM2-135M-Instruct.Q4_1.gguf --model /tmp/smollm2`` to convert it there first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import _common
from _stand_in import Budget, stand_in_model

PARTS = ("forward", "pick", "take", "release", "trim", "open", "rest")
BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 64), (65, 128), (129, 256), (257, 1 << 30))


@dataclass
class Meter:
    """Seconds by part of each decode step, and of admission (filled by :func:`instrument`'s wrappers)."""

    sync: Callable[[], None]
    events: bool
    steps: list[dict[str, float]] = field(default_factory=list)
    spans: list[tuple[Any, Any]] = field(default_factory=list)
    admit: float = 0.0
    admit_forward: float = 0.0
    join: float = 0.0
    in_step: bool = False
    in_graph: bool = False
    shapes: set[tuple[int, int]] = field(default_factory=set)
    copies: int = 0
    current: dict[str, float] = field(default_factory=dict)

    def add(self, part: str, seconds: float) -> None:
        self.current[part] = self.current.get(part, 0.0) + seconds


def _timed(meter: Meter, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if meter.in_step:
                meter.add(part, time.perf_counter() - t0)

    return wrapper


SEAMS = ("engine.model_runner.ModelRunner.forward", "engine.model_runner.ModelRunner.pick",
         "engine.decode_batch.DecodeBatch.step", "engine.decode_batch.DecodeBatch.join",
         "engine.decode_batch.DecodeBatch._release", "engine.decode_batch.take_token",
         "engine.admission.Admission.admit", "engine.kv_store.DecodeSlots.trim",
         "engine.kv_store.DecodeSlots.open_step", "engine.kv_store.KVStore.place", "engine.kv_store.KVStore._indices",
         "engine.step_graphs.StepGraphs.run")
"""The engine's methods this benchmark times (under ``lm_eval_toolfid.``): each must exist, or the run stops."""


def missing_seams() -> list[str]:
    """The :data:`SEAMS` the engine no longer has (a module, class or function renamed or gone)."""
    import importlib

    missing = []
    for seam in SEAMS:
        parts = seam.split(".")
        for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that imports is the module
            try:
                owner: Any = importlib.import_module("lm_eval_toolfid." + ".".join(parts[:cut]))
            except ImportError:
                continue
            for name in parts[cut:]:
                owner = getattr(owner, name, None)
            break
        else:
            owner = None
        if owner is None:
            missing.append(seam)
    return missing


def instrument(meter: Meter) -> Callable[[], None]:
    """Wrap the engine's seams with timers; returns the function that removes them. Stops with one line naming
    every seam the engine no longer has (a part left out silently would read as costing nothing)."""
    missing = missing_seams()
    if missing:
        raise SystemExit(f"gpu_base_pace: the engine no longer has {', '.join('lm_eval_toolfid.' + m for m in missing)}"
                         ", which this benchmark times: update SEAMS and instrument() in bench/gpu_base_pace.py to the "
                         "engine's current methods")
    import torch

    from lm_eval_toolfid.engine import decode_batch
    from lm_eval_toolfid.engine.admission import Admission
    from lm_eval_toolfid.engine.kv_store import DecodeSlots
    from lm_eval_toolfid.engine.model_runner import ModelRunner

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, new: Any) -> None:
        # a class's own attribute as stored (a staticmethod stays one when it is put back)
        saved.append((owner, name, vars(owner)[name] if name in vars(owner) else getattr(owner, name)))
        setattr(owner, name, new)

    forward, step, admit, join = ModelRunner.forward, decode_batch.DecodeBatch.step, Admission.admit, \
        decode_batch.DecodeBatch.join

    def timed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        is_step = kwargs.get("step", False)
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
            if meter.events and is_step else None
        if span:
            span[0].record()
        t0 = time.perf_counter()
        out = forward(self, *args, **kwargs)
        dt = time.perf_counter() - t0
        if span:
            span[1].record()
            meter.spans.append(span)
        if is_step and meter.in_graph:  # a capture's warm-up or recording: StepGraphs.run times it
            pass
        elif is_step:
            meter.add("forward", dt)
            mask = args[1] if len(args) > 1 else kwargs["attention_mask"]
            meter.shapes.add((int(mask.shape[0]), int(mask.shape[1])))
        else:
            meter.admit_forward += dt
        return out

    def timed_step(self: Any) -> Any:
        meter.in_step, meter.current = True, {"rows": float(len(self.rows))}
        t0 = time.perf_counter()
        try:
            return step(self)
        finally:
            meter.current["wall"] = time.perf_counter() - t0
            meter.in_step = False
            meter.steps.append(meter.current)

    def timed_admit(self: Any, rows: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return admit(self, rows)
        finally:
            meter.sync()
            meter.admit += time.perf_counter() - t0

    def timed_join(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return join(self, *args, **kwargs)
        finally:
            meter.join += time.perf_counter() - t0

    from lm_eval_toolfid.engine.kv_store import KVStore
    from lm_eval_toolfid.engine.step_graphs import StepGraphs

    replay = StepGraphs.run

    def timed_replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        meter.in_graph = True
        t0 = time.perf_counter()
        try:
            return replay(self, *args, **kwargs)
        finally:
            meter.in_graph = False
            meter.add("forward", time.perf_counter() - t0)

    patch(StepGraphs, "run", timed_replay)
    place, indices = KVStore.place, KVStore._indices

    def counted_place(kv: Any, slot: int, first: int, src: Any) -> None:
        meter.copies += 2 * len(kv) * len(src.spans)
        place(kv, slot, first, src)

    def counted_indices(self: Any, group: Any) -> Any:
        meter.copies += 2 * self.n_layers
        return indices(self, group)

    patch(KVStore, "place", staticmethod(counted_place))
    patch(KVStore, "_indices", counted_indices)
    patch(ModelRunner, "forward", timed_forward)
    patch(decode_batch.DecodeBatch, "step", timed_step)
    patch(Admission, "admit", timed_admit)
    patch(decode_batch.DecodeBatch, "join", timed_join)
    for owner, name, part in ((ModelRunner, "pick", "pick"), (decode_batch, "take_token", "take"),
                              (decode_batch.DecodeBatch, "_release", "release"), (DecodeSlots, "trim", "trim"),
                              (DecodeSlots, "open_step", "open")):
        patch(owner, name, _timed(meter, part, getattr(owner, name)))

    def restore() -> None:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)

    return restore


def task_defaults() -> tuple[dict[str, Any], dict[str, Any]]:
    """The task's own generation settings and prompt defaults (tasks/tool_use_fidelity.yaml)."""
    try:
        import yaml

        from lm_eval_toolfid.cases.bundled import tasks_path
    except ImportError:
        return {"until": ["\n###"], "max_gen_toks": 192}, {"prompt_template": "plain-v3", "plain_demos": 1}

    class Loader(yaml.SafeLoader):  # ``!function`` aside
        pass

    Loader.add_constructor("!function", lambda loader, node: None)
    task = yaml.load(next(Path(tasks_path()).rglob("tool_use_fidelity.yaml")).read_text(), Loader=Loader)
    return task.get("generation_kwargs") or {}, task.get("metadata") or {}


def view_rows(model: Any, model_path: str, n_cases: int, max_new: int | None,
              lengths: list[int] | None = None) -> tuple[Callable[[], list[Any]], int]:
    """A function making the view's rows (fresh stop rules each call), and the pad id. ``lengths``: each row stops
    after that many tokens instead (the stand-in model's rows)."""
    from transformers import AutoTokenizer

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.engine.decoding import Row
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper, eos_token_ids
    from lm_eval_toolfid.prompts.prompter import Prompter

    gen, meta = task_defaults()
    budget = max_new or int(gen.get("max_gen_toks", 192))
    tok = AutoTokenizer.from_pretrained(model_path)
    every = load_cases("default")
    cases = every[:n_cases]
    prompter = Prompter(meta.get("prompt_style", "auto"), None, model_args={"pretrained": model_path},
                        template=meta.get("prompt_template", "plain-v3"), cases=every,
                        plain_demos=int(meta.get("plain_demos", 1)))
    until = prompter.until(list(gen.get("until") or ["\n###"]))
    prompts = [tok(prompter.render(c), add_special_tokens=False)["input_ids"] for c in cases]
    prefixes = [prompter.answer_prefix(c) for c in cases]
    single = [len(c.expected_calls) <= 1 for c in cases]
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)

    def make() -> list[Any]:
        if lengths is not None:
            return [Row(prompt=p, max_new=budget, stopper=Budget(n)) for p, n in zip(prompts, lengths)]
        return [Row(prompt=p, max_new=budget, stopper=RowStopper(tok, eos, until, budget, call_end=s, prefix=x))
                for p, s, x in zip(prompts, single, prefixes)]

    print(f"{len(cases)} default cases, {prompter.settings.style} ({prompter.settings.template}, "
          f"{prompter.settings.demos} demo), until {until!r}, budget {budget} tokens; prompt tokens mean "
          f"{sum(map(len, prompts)) / max(1, len(prompts)):.0f}, max {max(map(len, prompts), default=0)}", flush=True)
    return make, int(pad)


def quantiles(values: list[float], qs: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9)) -> str:
    s = sorted(values)
    return ", ".join(f"p{int(q * 100)} {s[min(len(s) - 1, int(q * len(s)))]:.0f}" for q in qs) if s else "-"


def report(meter: Meter, wall: float, tokens: int, stats: Any, device: Any) -> None:
    steps = meter.steps
    total = {p: sum(s.get(p, 0.0) for s in steps) for p in PARTS if p != "rest"}
    step_wall = sum(s["wall"] for s in steps)
    total["release"] -= total["trim"]  # trim runs inside release
    total["rest"] = step_wall - sum(total.values())
    n = max(1, len(steps))
    rows = [s["rows"] for s in steps]
    print(f"  wall {wall:.2f} s, {tokens} tokens ({tokens / wall:,.0f} tok/s), {stats.forward_passes} forward passes, "
          f"{len(steps)} decode steps ({sum(rows):.0f} row-steps, {sum(rows) / n:.1f} live rows a step)")
    print(f"  live rows per step: {quantiles(rows)}, max {max(rows, default=0):.0f}; steps that released rows "
          f"{sum(1 for s in steps if 'release' in s)}; distinct (rows, columns) shapes {len(meter.shapes)}")
    print(f"  admission (prompt passes) {meter.admit:.3f} s, of which forward calls {meter.admit_forward:.3f} s; "
          f"joining the batch {meter.join:.3f} s; decode steps {step_wall:.3f} s; the rest of run "
          f"{wall - meter.admit - meter.join - step_wall:.3f} s; KV copy ops placing rows (prompt passes, joins) "
          f"{meter.copies}")
    print(f"  {'decode step part':18s} {'total':>9s} {'share':>6s} {'per step':>10s} {'per row-step':>13s}")
    for p in PARTS:
        print(f"  {p:18s} {total[p]:8.3f}s {100 * total[p] / max(step_wall, 1e-9):5.1f}% "
              f"{1e3 * total[p] / n:8.3f}ms {1e6 * total[p] / max(1.0, sum(rows)):11.2f}us")
    host = step_wall - total["forward"]
    print(f"  host work outside the forward call: {host:.3f} s ({1e3 * host / n:.3f} ms a step)")
    replayed = stats.steps_replayed
    print(f"  decode steps replayed from CUDA graphs {replayed}, launched op by op {len(stats.step_rows) - replayed}; "
          f"host time per step {1e3 * step_wall / n:.3f} ms; captures {stats.graph_captures} in "
          f"{stats.capture_seconds:.3f} s (inside the replayed steps' forward), graph memory "
          f"{stats.graph_bytes / 2**20:.0f} MiB")
    if meter.spans:
        meter.sync()
        dev = sum(a.elapsed_time(b) for a, b in meter.spans) / 1e3
        print(f"  device span of the decode forwards (CUDA events): {dev:.3f} s ({1e3 * dev / n:.3f} ms a step) "
              f"against {total['forward']:.3f} s of host time launching them")
    print(f"  {'live rows':>10s} {'steps':>6s} {'step wall':>10s} {'per step':>9s} {'forward':>9s}")
    by: dict[tuple[int, int], list[dict[str, float]]] = defaultdict(list)
    for s in steps:
        by[next(b for b in BUCKETS if b[0] <= s["rows"] <= b[1])].append(s)
    for b in BUCKETS:
        if by[b]:
            w = sum(s["wall"] for s in by[b])
            f = sum(s.get("forward", 0.0) for s in by[b])
            label = f"{b[0]}" if b[0] == b[1] else f"{b[0]}-{b[1]}" if b[1] < 1 << 30 else f">={b[0]}"
            print(f"  {label:>10s} {len(by[b]):6d} {w:9.3f}s {1e3 * w / len(by[b]):7.2f}ms {f:8.3f}s")
    _ = device


def figures(meter: Meter, wall: float, tokens: int, stats: Any) -> dict[str, Any]:
    """One run's figures as :func:`report` prints them, for ``--json-out``."""
    steps = meter.steps
    n = max(1, len(steps))
    step_wall = sum(s["wall"] for s in steps)
    forward = sum(s.get("forward", 0.0) for s in steps)
    out = {"wall_s": round(wall, 3), "tokens": tokens, "decode_steps": len(steps),
           "steps_replayed": stats.steps_replayed, "steps_launched": len(stats.step_rows) - stats.steps_replayed,
           "host_ms_per_step": round(1e3 * step_wall / n, 3), "forward_ms_per_step": round(1e3 * forward / n, 3),
           "admission_s": round(meter.admit, 3), "captures": stats.graph_captures,
           "capture_s": round(stats.capture_seconds, 3), "graph_mib": round(stats.graph_bytes / 2**20, 1)}
    if meter.spans:
        meter.sync()
        out["device_span_s"] = round(sum(a.elapsed_time(b) for a, b in meter.spans) / 1e3, 3)
    return out


def one_batch_schedule(lengths: list[int]) -> None:
    """The decode steps of rows of these token counts when every row decodes in one batch (a GPU's ``auto``): the
    first token comes from the prompt pass, so a row of L tokens is live in steps 1..L-1; steps = the longest - 1."""
    steps = max(lengths, default=1) - 1
    live = [sum(1 for n in lengths if n - 1 >= s) for s in range(1, steps + 1)]
    print(f"every row in one batch: {steps} decode steps, {sum(live)} row-steps ({sum(live) / max(1, steps):.1f} live "
          f"rows a step); live rows per step: {quantiles(live)}; rows at the budget: "
          f"{sum(1 for n in lengths if n == max(lengths))}")
    for lo, hi in BUCKETS:
        k = sum(1 for n in live if lo <= n <= hi)
        if k:
            label = f"{lo}" if lo == hi else f"{lo}-{hi}" if hi < 1 << 30 else f">={lo}"
            print(f"  {label:>10s} live rows: {k:4d} steps ({100 * k / max(1, steps):.0f}%)")


def profile_summary(prof: Any, steps: int, device: Any) -> None:
    events = prof.key_averages()
    if device.type == "cuda":
        try:
            print(events.table(sort_by="self_device_time_total", row_limit=15))
        except (KeyError, AttributeError, ValueError):
            print(events.table(sort_by="self_cuda_time_total", row_limit=15))
    print(events.table(sort_by="self_cpu_time_total", row_limit=15))
    launches = sum(e.count for e in events if "LaunchKernel" in e.key or e.key.startswith("cudaLaunch"))
    kernels = sum(e.count for e in events if getattr(e, "device_type", None) is not None
                  and str(e.device_type).endswith("CUDA"))
    if device.type == "cuda":
        print(f"  kernel launches (runtime API calls): {launches} ({launches / max(1, steps):.0f} per decode step, "
              f"prompt passes included); device kernels: {kernels}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a model folder, or smollm2 (prepared locally)")
    parser.add_argument("--gguf", default=None, help="convert this GGUF into --model first (the GPU machine)")
    parser.add_argument("--cases", type=int, default=382, help="the first N default cases (default: all 382)")
    parser.add_argument("--max-new", type=int, default=None, help="token budget (default: the task's max_gen_toks)")
    parser.add_argument("--batch", type=int, default=0, help="rows decoding at once (default: every row)")
    parser.add_argument("--dtype", default=None, help="bfloat16 (CUDA default) or float32 (CPU default)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeat", type=int, default=None, help="runs (default: 2 on CUDA, the first pays new "
                        "shapes; 1 on CPU)")
    parser.add_argument("--no-share", action="store_true", help="prompt prefixes computed whole")
    parser.add_argument("--sdpa", default="default", choices=("default", "cudnn", "efficient", "flash", "math"),
                        help="the attention backend torch's SDPA may use (default: its own choice)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler summary of the last run")
    parser.add_argument("--cuda-graphs", action="store_true", help="capture each decode step once per bucket of live "
                        "rows and replay it (CUDA; on the CPU: steps at the captured shapes, run eagerly)")
    parser.add_argument("--stand-in", action="store_true", help="a stand-in model without arithmetic "
                        "(bench/_stand_in.py): only the engine's own work is timed; rows stop after the lengths of "
                        "--lengths-from, else of a spread like the real view's")
    parser.add_argument("--lengths-from", default=None, help="a --tokens-out file: the stand-in's row lengths")
    parser.add_argument("--tokens-out", default=None, help="write every row's tokens (JSON)")
    parser.add_argument("--tokens-ref", default=None, help="compare every row's tokens with this file")
    parser.add_argument("--json-out", default=None, help="write every run's figures and the token comparison (JSON)")
    parser.add_argument("--schedule-from", default=None, help="only print the one-batch schedule of a --tokens-out "
                        "file's rows (steps, live rows per step), no model")
    args = parser.parse_args()
    if args.schedule_from:
        one_batch_schedule([len(t) for t in json.loads(Path(args.schedule_from).read_text())][:args.cases])
        return
    n_threads = _common.threads()

    import torch
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.integrations.lm_eval.batch_size import PREFILL_TOKENS
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine

    if args.gguf:
        from scripts.real_models import convert_gguf

        if not Path(args.model).is_dir():
            convert_gguf(Path(args.gguf), Path(args.model))
    path = _common.real_model(args.model)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    repeat = args.repeat or (2 if device.type == "cuda" else 1)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {n_threads} torch thread(s)"
    print(f"{Path(path).name}, {str(dtype).removeprefix('torch.')}, {where}, torch {torch.__version__}")
    lengths = None
    if args.stand_in:
        model = stand_in_model(path, dtype, device)
        budget = args.max_new or int(task_defaults()[0].get("max_gen_toks", 192))
        if args.lengths_from:
            lengths = [max(1, len(t)) for t in json.loads(Path(args.lengths_from).read_text())][:args.cases]
        else:  # about the real view's spread (SmolLM2, plain-v3): median ~45 tokens, 1 row in 10 to the budget
            rng = random.Random(0)
            lengths = [budget if rng.random() < 0.1 else min(budget, max(1, int(rng.lognormvariate(3.8, 0.45))))
                       for _ in range(args.cases)]
        print(f"stand-in model (no arithmetic): rows of {sum(lengths)} tokens, the longest {max(lengths)}")
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    make_rows, pad = view_rows(model, path, args.cases, args.max_new, lengths)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def backend() -> Any:
        if args.sdpa == "default":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                            "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[args.sdpa])

    results = None
    summary: dict[str, Any] = {"model": Path(path).name, "dtype": str(dtype).removeprefix("torch."), "device": where,
                               "torch": torch.__version__, "cases": args.cases, "cuda_graphs": args.cuda_graphs,
                               "runs": []}
    for rep in range(repeat):
        rows = make_rows()
        config = EngineConfig(max_batch=args.batch or len(rows), share_prefixes=not args.no_share,
                              prefill_tokens=PREFILL_TOKENS.get(device.type, PREFILL_TOKENS["cpu"]),
                              cuda_graphs=args.cuda_graphs, graph_shapes=args.cuda_graphs and device.type != "cuda")
        engine = GreedyEngine(model, pad, config)
        meter = Meter(sync, events=device.type == "cuda")
        restore = instrument(meter)
        last = rep == repeat - 1
        prof = None
        if args.profile and last:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                            if device.type == "cuda" else [])
            prof = torch.profiler.profile(activities=acts)
            prof.__enter__()
        try:
            sync()
            t0 = time.perf_counter()
            with backend():
                results = engine.run(rows)
            sync()
            wall = time.perf_counter() - t0
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)
            restore()
        print(f"run {rep + 1} of {repeat} (max_batch {config.max_batch}, prefixes "
              f"{'computed whole' if args.no_share else 'shared'}, SDPA backend {args.sdpa}, CUDA graphs "
              f"{'on' if args.cuda_graphs else 'off'}):")
        report(meter, wall, sum(len(r.tokens) for r in results), engine.stats, device)
        summary["runs"].append(figures(meter, wall, sum(len(r.tokens) for r in results), engine.stats))
        if args.json_out:  # after every run: a run cut short still leaves the ones before it
            Path(args.json_out).write_text(json.dumps(summary, indent=1))
        if prof is not None:
            profile_summary(prof, len(meter.steps), device)
    assert results is not None
    tokens = [r.tokens for r in results]
    one_batch_schedule([len(t) for t in tokens])
    if args.tokens_out:
        Path(args.tokens_out).write_text(json.dumps(tokens))
    if args.tokens_ref:
        ref = json.loads(Path(args.tokens_ref).read_text())
        same = sum(a == b for a, b in zip(ref, tokens))
        summary["tokens_identical"] = {"same": same, "ref_rows": len(ref), "rows": len(tokens)}
        print(f"tokens identical to {args.tokens_ref}: {same}/{len(ref)} rows"
              + ("" if len(ref) == len(tokens) else f" (row counts differ: {len(ref)} vs {len(tokens)})"))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
