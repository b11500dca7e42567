#!/usr/bin/env python
"""Benchmark: decoding against the machine's limits (issue #15 item 5), in one run.

1. The hardware: memory read bandwidth (sum over 1 GiB) and fp32 matmul throughput (2048³ GEMM),
   best of a few tries, with the torch threads this run uses.
2. The model: bytes read per decode step (every weight but the input embedding) and FLOPs per
   token (2 × those parameters; prompt tokens skip the lm_head).
3. One decode step against batch size (a cache of ``--context`` tokens per row): measured seconds
   and tokens/s beside the limit ``max(weight bytes ÷ bandwidth, rows × FLOPs ÷ matmul rate)``, and
   beside the limit that also counts what attention must read every step: every row's cached keys and
   values (``rows × context × KV bytes per token``; fp32, at batch 64 and 600 tokens as much as the weights
   or more).
4. A real base view (``--cases`` default cases, chat template) through lm-eval's ``simple_evaluate``:
   toolfid's engine at ``--batch-size`` and at ``auto``, and the path before it (transformers'
   ``generate`` in lm-eval's batches, per-row stop at the end of the call), with the view's floor:
   its prompt tokens' FLOPs ÷ matmul rate + Σ over its decode steps of the step limit.

    nice .venv/bin/python bench/bench_decode_pace.py --cases 12 --batch-size 8
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import subset_file, threads

QWEN = "qwen2.5-coder-0.5b-instruct"


def best(fn: Any, tries: int = 5) -> float:
    times = []
    for _ in range(tries):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bandwidth() -> float:
    """Bytes/s reading 1 GiB of float32 (best of 5)."""
    import torch

    x = torch.ones(256 * 1024 * 1024, dtype=torch.float32)
    x.sum()
    return x.numel() * 4 / best(lambda: x.sum())


def matmul_rate() -> float:
    """FLOP/s of a 2048³ float32 GEMM (best of 5)."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    return 2 * 2048 ** 3 / best(lambda: a @ b)


def model_costs(model: Any) -> tuple[int, float, float]:
    """(weight bytes per decode step, FLOPs per generated token, FLOPs per prompt token)."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    seen, total, n_head = set(), 0, 0
    for p in model.parameters():
        if p.data_ptr() in seen or p.data_ptr() == emb.data_ptr() and p.data_ptr() != head.data_ptr():
            continue
        seen.add(p.data_ptr())
        total += p.numel()
    n_head = head.numel()
    dtype_bytes = emb.element_size()
    return total * dtype_bytes, 2.0 * total, 2.0 * (total - n_head)


def step_times(model: Any, batches: list[int], context: int, steps: int = 3) -> dict[int, float]:
    """Seconds per decode step at each batch size, every row with ``context`` cached tokens."""
    import torch

    from lm_eval_toolfid.engine.model_runner import ModelFit
    from lm_eval_toolfid.engine.slot_cache import slot_cache_classes

    fit = ModelFit.of(model)
    SlotLayer, SlotCache = slot_cache_classes()
    ids = torch.randint(1000, 20000, (1, context))
    with torch.inference_mode():
        cache = SlotCache([SlotLayer(context) for _ in range(fit.n_layers)])
        model(input_ids=ids, **{fit.cache_arg: cache}, use_cache=True, logits_to_keep=1)
        out = {}
        for b in batches:
            layers = []
            for layer in cache.layers:
                k = layer.kbuf.new_zeros(b, layer.kbuf.shape[1], context + steps + 1, layer.kbuf.shape[3])
                v = layer.vbuf.new_zeros(b, layer.vbuf.shape[1], context + steps + 1, layer.vbuf.shape[3])
                k[:, :, :context] = layer.kbuf[:, :, :context]
                v[:, :, :context] = layer.vbuf[:, :, :context]
                layers.append(SlotLayer(context + steps + 1, k, v, length=context))
            c = SlotCache(layers)
            token = torch.full((b, 1), 1234)
            t = []
            for s in range(steps):
                mask = torch.ones(b, context + s + 1, dtype=torch.long)
                t0 = time.perf_counter()
                logits = model(input_ids=token, attention_mask=mask, position_ids=torch.full((b, 1), context + s),
                               **{fit.cache_arg: c}, use_cache=True, logits_to_keep=1).logits
                logits.argmax(-1)
                t.append(time.perf_counter() - t0)
            out[b] = min(t)
    return out


def run_view(lm: Any, model: str, cases: Path, task: str) -> tuple[float, int, dict]:
    import lm_eval.evaluator
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import tasks_path

    lm_eval.evaluator.get_git_commit_hash = lambda: None
    emitted = [0]
    original = lm._model_generate

    def counting(context: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(context, *args, **kwargs)
        emitted[0] += int((out[:, context.shape[1]:] != lm.tokenizer.pad_token_id).sum())
        return out

    lm._model_generate = counting
    manager = TaskManager(include_path=str(tasks_path()), include_defaults=False,
                          metadata={"pretrained": model, "cases": str(cases), "write_reference": False})
    t0 = time.perf_counter()
    out = simple_evaluate(model=lm, model_args={"pretrained": model}, tasks=[task], task_manager=manager,
                          log_samples=True, bootstrap_iters=0)
    wall = time.perf_counter() - t0
    lm._model_generate = original
    gens = {s["doc"]["id"]: s["resps"][0][0] for s in out["samples"][task]}
    return wall, emitted[0], gens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: Qwen2.5-Coder-0.5B-Instruct)")
    parser.add_argument("--cases", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--context", type=int, default=600, help="cached tokens per row in the step timing")
    parser.add_argument("--batches", default="1,4,8,16,32,64")
    parser.add_argument("--skip-views", action="store_true")
    args = parser.parse_args()
    n_threads = threads()

    import torch

    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM
    from scripts.real_models import models_dir

    model_path = args.model or str(models_dir() / QWEN)
    bw, rate = bandwidth(), matmul_rate()
    print(f"CPU, {n_threads} torch thread(s): memory read {bw / 2**30:.1f} GiB/s, fp32 matmul {rate / 1e9:.0f} GFLOP/s")
    lm = ToolfidHFLM(pretrained=model_path, batch_size=args.batch_size, device="cpu")
    W, F, Fp = model_costs(lm.model)
    print(f"{Path(model_path).name}: {W / 2**30:.2f} GiB read per decode step, {F / 1e9:.2f} GFLOP per generated "
          f"token, {Fp / 1e9:.2f} GFLOP per prompt token")

    from lm_eval_toolfid.integrations.lm_eval.batch_size import kv_bytes_per_token

    kv_token = kv_bytes_per_token(lm.model)

    def limit(rows: int) -> float:
        return max(W / bw, rows * F / rate)

    def limit_kv(rows: int, context: int) -> float:
        """The limit with the KV cache read counted too: every row's keys and values, each step."""
        return max((W + rows * context * kv_token) / bw, rows * F / rate)

    print(f"\ndecode step, {args.context} cached tokens per row ({kv_token / 1024:.1f} KiB of keys and values per "
          "token; attention reads all of them every step):")
    print(f"  {'rows':>4s} {'step':>8s} {'tok/s':>7s} {'limit step':>11s} {'measured/limit':>15s} "
          f"{'limit with KV read':>19s} {'measured/that':>14s}")
    for b, s in step_times(lm.model, [int(x) for x in args.batches.split(",")], args.context).items():
        lk = limit_kv(b, args.context)
        print(f"  {b:4d} {s:7.3f}s {b / s:7.1f} {limit(b):10.3f}s {s / limit(b):15.2f} {lk:18.3f}s {s / lk:14.2f}")
    if args.skip_views:
        return

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TOOLFID_HOME"] = str(Path(tmp) / "home")
        cases = subset_file(args.cases, Path(tmp) / "cases.jsonl")
        task = "tool_use_fidelity_chat"
        print(f"\nbase view, {args.cases} default cases, chat template (simple_evaluate):")
        print(f"  {'generation':44s} {'wall':>8s} {'emitted tok':>11s} {'tok/s':>7s} {'floor':>8s} {'wall/floor':>10s}")
        runs = {}
        for label, use_engine, batch in (("generate (before), batch %d" % args.batch_size, False, args.batch_size),
                                         ("engine, batch %d" % args.batch_size, True, args.batch_size),
                                         ("engine, batch auto", True, "auto")):
            lm.use_engine = use_engine
            lm.batch_size_per_gpu = batch
            lm.engine_stats = None
            wall, emitted, gens = run_view(lm, model_path, cases, task)
            runs[label] = gens
            stats = lm.engine_stats
            if stats is not None:
                floor = stats.prompt_tokens * Fp / rate + sum(limit(r) for r in stats.step_rows)
                floor_text = f"{floor:7.1f}s {wall / floor:10.2f}"
                ran = f" (ran {max(stats.step_rows, default=0)} rows; {stats.prompt_tokens} prompt tokens, " \
                      f"{stats.padded_tokens - stats.prompt_tokens} padding, {len(stats.step_rows)} steps)"
            else:
                floor_text, ran = f"{'—':>8s} {'—':>10s}", ""
            print(f"  {label:44s} {wall:7.1f}s {emitted:11d} {emitted / wall:7.1f} {floor_text}{ran}", flush=True)
        first = next(iter(runs.values()))
        same = all(g == first for g in runs.values())
        print(f"  generations identical across the three: {same}")
    _ = torch


if __name__ == "__main__":
    main()
