#!/usr/bin/env python
"""Benchmark: generated tokens / tokens of the parsed calls, with and without stop-at-call-end.

Runs the same base view of the default task (the task's default prompt: plain-v3, 1 demo) on SmolLM2-135M-Instruct
twice in one process: lm-eval's ``HFLM`` (stops a batch only when every row hit ``until``) and
``ToolfidHFLM`` (stops each row once its call is complete). For each prints

- emitted tokens / call tokens: tokens each row generated up to its own finish, over the tokens
  of the text up to the end of each parsed call (target <= 1.3);
- computed tokens / call tokens: rows x decode steps of every batch (finished rows still occupy
  their slot until the batch ends), the compute actually spent;
- the wall time of the view, and whether json_valid_rate is unchanged.

Usage: ``nice -n 10 .venv/bin/python bench/bench_tokens.py [--cases 8] [--batch-size 8]``
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
    args = parser.parse_args()
    model = args.model or real_model()
    n_threads = threads()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for label, stopping in (("HFLM (until only)", False), ("ToolfidHFLM (call end)", True)):
            profile, metrics, lm = run_view(model, "default", Path(tmp) / "home", stopping=stopping,
                                            batch_size=args.batch_size, limit=args.cases)
            ctoks, n_calls = call_tokens(lm.tokenizer, profile.generations, profile.prompts)
            rows[label] = (profile, metrics, ctoks, n_calls)
            del lm
    print(f"SmolLM2-135M-Instruct, {args.cases} default cases, default prompt (plain-v3, 1 demo), batch {args.batch_size}, "
          f"max_gen_toks 192, CPU, {n_threads} torch thread(s)")
    for label, (p, m, ctoks, n_calls) in rows.items():
        print(f"  {label:24s} emitted/call {p.emitted_tokens / max(ctoks, 1):5.2f}  "
              f"computed/call {p.compute_tokens / max(ctoks, 1):5.2f}  "
              f"(emitted {p.emitted_tokens}, computed {p.compute_tokens}, call tokens {ctoks} in {n_calls} calls)  "
              f"generation {p.prefill_s + p.decode_s:6.1f} s  json_valid_rate {m['json_valid_rate']:.3f}")
    (a, _, _, _), (b, _, _, _) = rows.values()
    print(f"  generation time with/without stopping: {(b.prefill_s + b.decode_s) / (a.prefill_s + a.decode_s):.3f}")


if __name__ == "__main__":
    main()
