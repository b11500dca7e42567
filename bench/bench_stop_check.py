#!/usr/bin/env python
"""Benchmark: the early stop against generation run on, per model and prompt style, on real generations.

For each style, ``--single`` single requests and ``--multi`` conversations spread over the default set are
generated once by the engine with each row's stop rule exactly as ``toolfid run`` builds it, the rows running
on past their stop to where lm-eval's own generation ends (tests/stop_property.py). Prints per style: cases,
rows the rule stopped before lm-eval's generation would end, tokens saved, cases whose scored answer differs
between the stopped row and the whole run (must be 0), and cases a rule fed the generation alone (no primer:
the defect of issue 28) would have scored otherwise, with the wall time.

Usage::

    .venv/bin/python bench/bench_stop_check.py [--model smollm2,qwen-coder] [--styles plain-v3,chat]
        [--single 48] [--multi 16]

Styles default to every style that applies: SmolLM2 plain-v3 (its default), plain-v1, plain-v2, chat, raw;
Qwen chat (its default) and plain-v3. (The user-facing form of this check on any model: ``toolfid run
--check-stops N``.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import real_model, threads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    from stop_property import QWEN_STYLES, SMOLLM2_STYLES, load, run_style, spread_cases, summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2,qwen-coder")
    parser.add_argument("--styles", default="", help="comma-separated (default: every style that applies)")
    parser.add_argument("--single", type=int, default=48)
    parser.add_argument("--multi", type=int, default=16)
    args = parser.parse_args()
    print(f"torch threads: {threads()}; cases per style: {args.single} single requests + {args.multi} "
          "conversations, spread over the default set")
    cases = spread_cases(args.single, args.multi)
    print(f"{'model':<12} {'style':<9} {'cases':>5} {'stopped early':>13} {'tokens saved':>14} {'differ':>6} "
          f"{'gen-only rule':>13} {'seconds':>8}")
    bad = 0
    for name in args.model.split(","):
        path = Path(real_model(name))
        styles = SMOLLM2_STYLES if "smol" in name else QWEN_STYLES
        chosen = [s for s in args.styles.split(",") if s] or list(styles)
        model, tok = load(path)
        threads()
        for style in chosen:
            started = time.monotonic()
            run = run_style(model, tok, path, *styles[style], cases)
            s = summary(run)
            bad += len(s["differ"])
            print(f"{name:<12} {style:<9} {s['cases']:>5} {s['stopped_early']:>13} "
                  f"{s['tokens_saved']:>7}/{s['tokens']:<6} {len(s['differ']):>6} {len(s['naive_differ']):>13} "
                  f"{time.monotonic() - started:>8.0f}", flush=True)
            if s["differ"]:
                print("  differ:", ", ".join(s["differ"]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
