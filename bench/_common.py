"""Shared helpers for the benchmarks: instrumented lm-eval views, token counting, case subsets."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread: on a busy 2-core machine two OpenMP threads spin against each other and a
# SmolLM2 decode step measured 14x slower (8.8 s vs 0.63 s) than with one.
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Clock:
    """Wall and CPU seconds of a ``with`` block."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "Clock":
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_: Any) -> None:
        self.wall = time.perf_counter() - self._w
        self.cpu = time.process_time() - self._c


def threads() -> int:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return torch.get_num_threads()


MODELS = {"smollm2": "prepare_smollm2", "qwen-coder": "prepare_qwen_coder", "gemma3": "prepare_gemma3"}
"""Model aliases the benchmarks take for --model (prepared by ``scripts.real_models``)."""


def real_model(name: str = "smollm2") -> str:
    """A local model folder: an alias of :data:`MODELS` (prepared on first use), or a path as given."""
    from lm_eval_toolfid.core.errors import ToolfidError
    from scripts import real_models as models

    if name not in MODELS:
        return name
    try:
        return str(getattr(models, MODELS[name])())
    except ToolfidError as exc:
        sys.exit(f"benchmark needs {name}: {exc}")


def subset_file(n: int, path: Path, shortest: bool = False) -> Path:
    """The first ``n`` default cases (or the ``n`` with the shortest JSON lines) as a case file."""
    from lm_eval_toolfid.cases.bundled import default_cases_path

    lines = [line for line in default_cases_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    if shortest:
        lines = sorted(lines, key=lambda line: (len(line), line))
    path.write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    return path


@dataclass
class Profile:
    """Wall time by phase, and token counts, of one instrumented view."""

    load_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    scoring_s: float = 0.0
    total_s: float = 0.0
    compute_tokens: int = 0  # rows x decode steps (what the batch actually computed)
    emitted_tokens: int = 0  # per row, tokens up to its own finish (eos/pad)
    batches: list[tuple[int, int, int]] = field(default_factory=list)  # (rows, context len, steps)
    generations: dict[str, str] = field(default_factory=dict)
    prompts: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)  # the task's own summary (with by_depth)
    records: dict[str, dict] = field(default_factory=dict)  # case id -> the task's per-case record
    toolfid: dict = field(default_factory=dict)  # the run's provenance (configs.<task>.metadata.toolfid)


def instrument(lm: Any, profile: Profile) -> None:
    """Wrap ``lm._model_generate`` to time prefill (until the first logits) and decoding, count tokens."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    original = lm._model_generate
    pad = lm.tokenizer.pad_token_id

    class FirstStep(LogitsProcessor):
        def __init__(self) -> None:
            self.t: float | None = None

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if self.t is None:
                self.t = time.perf_counter()
            return scores

    def timed(context: Any, max_length: int, stop: list[str], **kw: Any) -> Any:
        first = FirstStep()
        kw["logits_processor"] = LogitsProcessorList([first])
        start = time.perf_counter()
        out = original(context, max_length, stop, **kw)
        end = time.perf_counter()
        t_first = first.t or end
        profile.prefill_s += t_first - start
        profile.decode_s += end - t_first
        new = out[:, context.shape[1]:]
        steps = new.shape[1]
        profile.compute_tokens += new.shape[0] * steps
        for row in new.tolist():
            n = len(row)
            for i, tok in enumerate(row):
                if tok == pad:
                    n = i
                    break
            profile.emitted_tokens += n
        profile.batches.append((int(new.shape[0]), int(context.shape[1]), int(steps)))
        return out

    lm._model_generate = timed
    _ = torch


@contextmanager
def timed_scoring(profile: Profile) -> Iterator[None]:
    from lm_eval_toolfid.integrations.lm_eval import task as task_mod

    cls = task_mod.ToolUseFidelityTask
    original = cls.process_results

    def process_results(self: Any, doc: dict, results: list) -> dict:
        start = time.perf_counter()
        try:
            return original(self, doc, results)
        finally:
            profile.scoring_s += time.perf_counter() - start

    cls.process_results = process_results
    try:
        yield
    finally:
        cls.process_results = original


def run_view(model: str, cases: Path | str, home: Path, *, stopping: bool, batch_size: int = 16,
             max_gen_toks: int | None = None, lm: Any = None, profile: Profile | None = None,
             task: str = "tool_use_fidelity", extra_meta: dict | None = None,
             limit: int | None = None, samples: list[int] | None = None) -> tuple[Profile, dict, Any]:
    """One instrumented base view through lm-eval's ``simple_evaluate`` (what ``toolfid run`` does)."""
    import lm_eval.evaluator
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import tasks_path
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    lm_eval.evaluator.get_git_commit_hash = lambda: None
    os.environ["TOOLFID_HOME"] = str(home)
    profile = profile or Profile()
    t0 = time.perf_counter()
    if lm is None:
        cls = ToolfidHFLM if stopping else HFLM
        lm = cls(pretrained=model, batch_size=batch_size, device="cpu")
        profile.load_s = time.perf_counter() - t0
        lm._toolfid_original_generate = lm._model_generate
    lm._model_generate = getattr(lm, "_toolfid_original_generate", lm._model_generate)
    # these benchmarks time transformers' generate (prefill vs decode through a logits processor);
    # bench_decode_pace.py and bench_verify.py measure toolfid's engine
    lm.use_engine = False
    instrument(lm, profile)
    meta = {"pretrained": model, "cases": str(cases), "write_reference": False, **(extra_meta or {})}
    manager = TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata=meta)
    gen = {"gen_kwargs": f"max_gen_toks={max_gen_toks}"} if max_gen_toks else {}
    with timed_scoring(profile):
        out = simple_evaluate(model=lm, model_args={"pretrained": model}, tasks=[task], task_manager=manager,
                              log_samples=True, bootstrap_iters=0, limit=limit,
                              samples={task: samples} if samples is not None else None, **gen)
    profile.total_s = time.perf_counter() - t0
    samples = out.pop("samples")[task]
    profile.generations = {s["doc"]["id"]: s["resps"][0][0] for s in samples}
    from lm_eval_toolfid.pairing.samples import sample_prompt

    profile.prompts = {s["doc"]["id"]: sample_prompt(s) or "" for s in samples}
    profile.records = {s["doc"]["id"]: s.get("cases_scored") or s.get("fidelity_pass") for s in samples}
    profile.toolfid = out["configs"][task]["metadata"].get("toolfid", {})
    metrics = {k.split(",")[0]: v for k, v in out["results"][task].items() if "," in k and "stderr" not in k}
    profile.summary = ((out.get("configs", {}).get(task, {}).get("metadata") or {}).get("toolfid") or {}).get(
        "summary") or {}
    return profile, metrics, lm


def call_tokens(tokenizer: Any, generations: dict[str, str], prompts: dict[str, str] | None = None) -> tuple[int, int]:
    """(tokens of the parsed calls' generated text, number of generations with a parsed call).

    A primed answer (``plain-v3``) is scored with its primer; only the generated part is counted."""
    from lm_eval_toolfid.formats import parse_calls
    from lm_eval_toolfid.prompts.plain import restore_primer
    from lm_eval_toolfid.formats.call_end import truncate_call

    total = n = 0
    for cid, text in generations.items():
        whole = restore_primer((prompts or {}).get(cid), text)
        if parse_calls(whole).calls:
            end = truncate_call(whole)[len(whole) - len(text):]
            total += len(tokenizer(end, add_special_tokens=False)["input_ids"])
            n += 1
    return total, n


class _Budget:
    """A stop rule that never stops: the row's budget ends it (every row decodes the same number of steps)."""

    def push(self, token: int) -> str | None:
        return None


def step_costs(model: Any, adapters: list[str], counts: tuple[int, ...] = (0, 1, 2, 4, 10), *, prompts: int = 2,
               max_new: int = 8, stack: bool = True, repeats: int = 3) -> dict[int, Any]:
    """Calls and host ms of one decode step of the engine on ``model`` (a PEFT model; its first ``n`` adapters), for
    base + ``n`` adapter views decoded together, each view ``prompts`` rows (``n`` = 0: the base's rows alone, the
    adapters disabled). ``stack``: the stacked LoRA computation (False: PEFT's mixed batch). Host ms: the best of
    ``repeats`` runs' median step."""
    import contextlib

    import torch

    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine
    from lm_eval_toolfid.engine.rows import Row
    from lm_eval_toolfid.engine.step_cost import measure_steps

    ids = [[(7 * i + j) % 100 + 1 for j in range(12)] for i in range(prompts)]
    out = {}
    for n in counts:
        if n > len(adapters):
            continue
        views = [None, *adapters[:n]]

        def rows() -> list[Any]:
            return [Row(prompt=p, stopper=_Budget(), max_new=max_new, view=v if n else None) for p in ids for v in views]

        engine = GreedyEngine(model, 0, EngineConfig(stack_lora=stack, max_batch=64))
        off = model.disable_adapter() if n == 0 and hasattr(model, "disable_adapter") else contextlib.nullcontext()
        with off, torch.inference_mode():
            calls = measure_steps(engine, rows, timing=False).calls_per_step
            best = min(measure_steps(engine, rows, count=False).ms_per_step for _ in range(repeats))
        out[n] = (calls, best)
    return out


def print_step_costs(costs: dict[int, Any], label: str) -> None:
    """One line per adapter count: calls and host ms per decode step, and the ratio to base + 1."""
    one = costs.get(1)
    for n, (calls, ms) in costs.items():
        ratio = f"  {ms / one[1]:.2f}x base + 1" if one and n > 1 else ""
        print(f"{label:<8} base{f' + {n}' if n else '':<5} {calls:>7} calls/step {ms:>9.1f} ms/step{ratio}")
