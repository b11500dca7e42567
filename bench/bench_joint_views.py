#!/usr/bin/env python
"""Benchmark: the base and N adapter views decoded together vs one at a time (issue 37), in one run.

One model loaded once (``toolfid run``'s session); the same views evaluated twice through lm-eval, as
``toolfid run`` does: ``--views-together 1`` (each view its own engine run: the run before issue 37) and the
default (views decoded together, each row under its own LoRA). The adapters, made here (no training):

- ``zero``: a B = 0 LoRA (changes nothing: its answers must be the base's, bit for bit, in every dtype);
- ``null-K``: LoRAs on every attention and MLP projection with B ~ N(0, sigma) — from barely moving the answers
  to changing most of them (the drafts a verified view checks get rejected early).

Prints, per mode: each view's wall seconds, the whole run, (base + N views) / base view, and the run's ratio
to the one-at-a-time run; one decode step's aten calls and host ms for the base, base + 1 and base + N
(``_common.step_costs``); answers that differ between the modes (float32: none allowed; half precision: only
real adapters may differ, at near ties) and the B = 0 view's answers that differ from the base's (none allowed).

    OMP_NUM_THREADS=2 nice .venv/bin/python bench/bench_joint_views.py --cases 24 --adapters 4        # CPU, float32
    python bench/bench_joint_views.py --device cuda --dtype bfloat16 --cases 382 --adapters 10       # one GPU
    python bench/bench_joint_views.py --device cuda --dtype bfloat16 --cases 382 --adapters 10 \
        --modes together --cuda-graphs --json-out joint.json                                         # replayed steps
    OMP_NUM_THREADS=2 nice .venv/bin/python bench/bench_joint_views.py --cases 12 --adapters 100 --zero --modes together

``--zero``: every adapter B = 0 (each its own random A): the base + N figure then measures what N views cost besides
their answers (loading, routing, the harness), and each must have changed no output. ``--modes together`` skips the
one-at-a-time run: the base view alone (twice: cold, then warm), then the base and
every adapter together; (base + N) / base is then the together run over the warm base view. ``--cuda-graphs``: decode
steps captured and replayed (``toolfid run --cuda-graphs on``; CUDA only). ``--json-out`` writes the figures after
each phase, so a run cut short keeps the phases it finished.

Targets (issue 37): one H100/H200, bfloat16, SmolLM2, 382 cases: B = 0 identical 382/382, base + 10 adapter
views <= 3x the base view. CPU (2 cores, float32), 24 cases, base + 4: no slower than one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_step_costs, real_model, step_costs, subset_file, threads

SIGMAS = (1e-4, 1e-3, 3e-3, 1e-2)


def make_adapters(base: str, n: int, root: Path, seed: int = 0, zero: bool = False) -> dict[str, str]:
    """``zero`` and ``n - 1`` random-B LoRAs (sigma cycling through :data:`SIGMAS`), saved as PEFT folders; ``zero``:
    every one B = 0 (each its own random A: distinct files, none changes an answer)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out: dict[str, str] = {}
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    for k in range(n):
        name = "zero" if k == 0 else (f"zero-{k}" if zero else f"null-{k}")
        sigma = 0.0 if k == 0 or zero else SIGMAS[(k - 1) % len(SIGMAS)]
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if "lora_B" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * sigma)
                elif "lora_A" in pname and zero:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        path = root / name
        peft_model.save_pretrained(path)
        out[name] = str(path)
    return out


def quiet() -> Any:
    """A progress sink that prints nothing (lm-eval's own bars and logs stay off, as in ``toolfid run``)."""

    class Quiet:
        def __getattr__(self, _name: str) -> Any:
            return lambda *a, **k: None

    return Quiet()


def run_views(session: Any, plan: Any, base_only: bool = False
              ) -> tuple[dict[str, float], dict[str, dict[str, Any]], dict[str, Any]]:
    """Every view of ``plan`` (``base_only``: its base view) on the loaded session: seconds per view (from the previous
    view's end), answers per view (case id -> text), and each view's generation record."""
    from lm_eval_toolfid.run.plan import View

    views = [plan.base_view(), *([] if base_only else plan.adapter_views())]
    seconds: dict[str, float] = {}
    answers: dict[str, dict[str, Any]] = {}
    records: dict[str, Any] = {}
    t = time.perf_counter()
    for result in session.evaluate(views, plan):
        now = time.perf_counter()
        seconds[result.label] = now - t
        t = now
        answers[result.label] = {s["doc"]["id"]: s["resps"] for s in result.samples}
        meta = result.results["configs"][plan.task]["metadata"]["toolfid"]
        records[result.label] = meta.get("generation", {})
    assert all(isinstance(v, View) for v in views)
    return seconds, answers, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2 (default), qwen-coder, or a model folder")
    ap.add_argument("--cases", type=int, default=24, help="first N default cases (default 24)")
    ap.add_argument("--adapters", type=int, default=4, help="adapter views (default 4)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-verify", action="store_true", help="decode the adapter views (the half-precision default)")
    ap.add_argument("--batch-size", default="auto")
    ap.add_argument("--modes", choices=("both", "together"), default="both",
                    help="both (default): one at a time, then together; together: the base view alone, then together")
    ap.add_argument("--cuda-graphs", action="store_true", help="decode steps captured and replayed (CUDA only)")
    ap.add_argument("--json-out", default=None, help="write the figures as JSON here (after each phase)")
    ap.add_argument("--zero", action="store_true", help="every adapter B = 0 (distinct A): none may change an answer")
    args = ap.parse_args()
    n_threads = threads()
    base = real_model(args.model)
    root = Path(tempfile.mkdtemp(prefix="bench-joint-"))
    os.environ["TOOLFID_HOME"] = str(root / "home")
    from lm_eval_toolfid.cases.bundled import default_cases_path
    from lm_eval_toolfid.run.plan import ModelOptions, RunPlan
    from lm_eval_toolfid.run.session import ModelSession

    adapters = make_adapters(base, args.adapters, root / "adapters", zero=args.zero)
    cases = subset_file(args.cases, root / "cases.jsonl") if args.cases else default_cases_path()
    metadata: dict[str, Any] = {"cases": str(cases), **({"verify": False} if args.no_verify else {})}
    batch = int(args.batch_size) if str(args.batch_size).isdigit() else args.batch_size
    print(f"{args.model} on {args.device} ({n_threads} threads), {args.dtype}, {args.cases or 382} cases, base + "
          f"{args.adapters} adapters{' (--no-verify)' if args.no_verify else ''}"
          f"{', CUDA graphs' if args.cuda_graphs else ''}, modes {args.modes}", flush=True)
    out: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "cases": args.cases, "adapters": args.adapters,
                           "cuda_graphs": args.cuda_graphs, "modes": args.modes}

    def dump() -> None:
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(out, indent=1))

    results: dict[str, Any] = {}
    session = None
    phases = (("one at a time", 1, False), ("together", None, False)) if args.modes == "both" else \
        (("base cold", None, True), ("base", None, True), ("together", None, False))
    for mode, together, base_only in phases:
        options = ModelOptions(batch_size=batch, device=args.device, dtype=args.dtype, views_together=together,
                               cuda_graphs=args.cuda_graphs)
        plan = RunPlan(base=base, adapters=adapters, task="tool_use_fidelity", metadata=metadata, models=options,
                       verbose=False)
        if session is None:
            t_load = time.perf_counter()
            session = ModelSession(base, options, progress=quiet(), verbose=False).load(adapters)
            out["load_s"] = round(time.perf_counter() - t_load, 3)
            from lm_eval_toolfid.engine.adapter_store import stored_names

            out["stored_adapters"] = len(stored_names(session.peft_model))
            print(f"loaded the base and {len(adapters)} adapters in {out['load_s']:.2f} s ({out['stored_adapters']} "
                  "read into the engine's store, the rest by PEFT)", flush=True)
        session.options = options
        out["running"] = {"phase": mode, "since_epoch": round(time.time(), 1)}  # a run cut short: how long it ran
        dump()
        t0 = time.perf_counter()
        seconds, answers, records = run_views(session, plan, base_only)
        results[mode] = {"wall": time.perf_counter() - t0, "seconds": seconds, "answers": answers, "records": records}
        out[mode.replace(" ", "_") + "_s"] = round(results[mode]["wall"], 3)
        graphs = [r.get("step_graphs") for r in records.values() if r.get("step_graphs")]
        if graphs:
            out[mode.replace(" ", "_") + "_step_graphs"] = graphs[0]
        print(f"{mode}: {results[mode]['wall']:.2f} s", flush=True)
        del out["running"]
        dump()
    print()
    joint = results["together"]
    if args.modes == "both":
        one = results["one at a time"]
        labels = ["base", *adapters]
        print(f"{'view':<10} {'alone s':>8} {'together s':>11} {'differ':>7}  path together")
        for label in labels:
            a, b = one["answers"][label], joint["answers"][label]
            differ = sum(1 for cid in a if a[cid] != b.get(cid))
            rec = joint["records"][label]
            path = ("verified" if rec.get("rows_verified") else "decoded") + (
                f" with {'+'.join(rec['views_together'])}" if rec.get("views_together") else " alone")
            print(f"{label:<10} {one['seconds'][label]:>8.2f} {joint['seconds'][label]:>11.2f} {differ:>7}  {path}")
        base_s = one["seconds"]["base"]
        print(f"\nwhole run: one at a time {one['wall']:.2f} s ({one['wall'] / base_s:.2f}x the base view), together "
              f"{joint['wall']:.2f} s ({joint['wall'] / base_s:.2f}x); together / one at a time = "
              f"{joint['wall'] / one['wall']:.2f}")
    else:
        base_s = results["base"]["wall"]
        differ = sum(1 for cid, text in results["base"]["answers"]["base"].items()
                     if text != joint["answers"]["base"].get(cid))
        print(f"base view alone: {results['base cold']['wall']:.2f} s cold, {base_s:.2f} s warm; base + "
              f"{args.adapters} together {joint['wall']:.2f} s ({joint['wall'] / base_s:.2f}x the warm base view); "
              f"base answers that differ between alone and together: {differ}")
        out["base_alone_together_differ"] = differ
    zero_differ = sum(1 for cid, text in joint["answers"]["zero"].items() if text != joint["answers"]["base"][cid])
    print(f"B = 0 answers that differ from the base's (together): {zero_differ} of {len(joint['answers']['base'])}")
    if args.zero:  # every adapter B = 0: each must have changed no output
        changed = [label for label in adapters
                   if any(text != joint["answers"]["base"][cid] for cid, text in joint["answers"][label].items())]
        print(f"B = 0 adapters whose answers differ from the base's: {len(changed)} of {len(adapters)}"
              f"{' (' + ', '.join(changed[:5]) + ')' if changed else ''}")
        out["zero_adapters_changed"] = len(changed)
    out.update({"base_view_s": round(base_s, 3), "together_s": round(joint["wall"], 3),
                "ratio": round(joint["wall"] / base_s, 3), "zero_differ": zero_differ,
                "zero_cases": len(joint["answers"]["base"])})
    if args.modes == "both":
        out["one_at_a_time_s"] = round(results["one at a time"]["wall"], 3)
    dump()
    steps = step_costs(session.peft_model, list(session.adapters), counts=(0, 1, args.adapters))
    print("one decode step of the session's model (2 rows a view, the host's calls and milliseconds; on a GPU a step "
          "costs its launches):")
    print_step_costs(steps, "step")
    out.update({"step_calls": {n: c for n, (c, _) in steps.items()},
                "step_ms": {n: round(ms, 2) for n, (_, ms) in steps.items()}})
    dump()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
