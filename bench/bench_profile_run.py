#!/usr/bin/env python
"""Benchmark: where a run's time goes (model load, prompt processing, decoding, scoring, rest).

One base view of the default task on SmolLM2-135M-Instruct (first ~8 cases, the task's default prompt: plain-v3, 1 demo),
through lm-eval's ``simple_evaluate`` as ``toolfid run`` does it, with lm-eval's ``HFLM`` and then
with ``ToolfidHFLM`` (stop at call end). Prefill is the time from ``generate`` to the first logits
of each batch; decoding the rest of ``generate``; scoring the time inside ``process_results``.
Also prints the batches lm-eval formed (rows, context length, steps) to show its length sorting.

Usage: ``nice -n 10 .venv/bin/python bench/bench_profile_run.py [--cases 8] [--batch-size 8]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import call_tokens, real_model, run_view, threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--model", default=None)
    parser.add_argument("--only-stopping", action="store_true")
    args = parser.parse_args()
    model = args.model or real_model()
    n_threads = threads()
    variants = [("ToolfidHFLM", True)] if args.only_stopping else [("HFLM", False), ("ToolfidHFLM", True)]
    with tempfile.TemporaryDirectory() as tmp:
        results = []
        for label, stopping in variants:
            profile, metrics, lm = run_view(model, "default", Path(tmp) / "home", stopping=stopping,
                                            batch_size=args.batch_size, limit=args.cases)
            results.append((label, profile, metrics, call_tokens(lm.tokenizer, profile.generations, profile.prompts)))
            del lm
    print(f"SmolLM2-135M-Instruct, {args.cases} default cases, batch {args.batch_size}, CPU, {n_threads} torch thread(s)")
    for label, p, m, (ctoks, n_calls) in results:
        rest = p.total_s - p.load_s - p.prefill_s - p.decode_s - p.scoring_s
        print(f"  {label}: total {p.total_s:6.1f} s  json_valid_rate {m['json_valid_rate']:.3f}")
        for name, value in (("model load", p.load_s), ("prompt processing (prefill)", p.prefill_s),
                            ("decoding", p.decode_s), ("scoring (process_results)", p.scoring_s),
                            ("rest (tokenising, lm-eval, aggregation)", rest)):
            print(f"    {name:42s} {value:7.2f} s  {100 * value / p.total_s:5.1f} %")
        print(f"    tokens: emitted {p.emitted_tokens}, computed (rows x steps) {p.compute_tokens}, of parsed "
              f"calls {ctoks} ({n_calls} calls): emitted/call {p.emitted_tokens / max(ctoks, 1):.2f}, "
              f"computed/call {p.compute_tokens / max(ctoks, 1):.2f}")
        ctx = [c for _, c, _ in p.batches]
        print(f"    batches (rows, context tokens, decode steps): {p.batches}")
        print(f"    batches in descending context length: {ctx == sorted(ctx, reverse=True)}")


if __name__ == "__main__":
    main()
