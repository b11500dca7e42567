#!/usr/bin/env python
"""Benchmark: a real model's base json_valid_rate / parse_rate per prompt style and template.

Each variant is one base view of the ``tool_use_fidelity`` task through lm-eval's
``simple_evaluate`` on one loaded ``ToolfidHFLM`` (what ``toolfid run`` does: stop at the end
of the call), scored by the task itself. A variant is ``style/template/demos``:
``plain/plain-v3/1`` (the task's default), ``plain/plain-v1/2`` (the original), ``plain/plain-v2/2``
(signatures), ``chat//0`` (the model's own chat template with the case's tools), ``raw//0``.

Prints per variant: json_valid_rate, parse_rate, mean prompt tokens, emitted tokens / tokens of
the calls themselves, and the view's wall time.

Usage: ``.venv/bin/python bench/bench_prompt_validity.py [--cases 268] [--variants ...] [--model DIR]
[--case-file FILE]`` (``--cases`` takes the first N cases of the case file, the default set unless
``--case-file`` names another; examples for plain-v3 come from the whole file). A case file with
conversations also gets its validity and result grounding per turn depth.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import call_tokens, real_model, run_view, threads

DEFAULT_VARIANTS = "plain/plain-v3/1,plain/plain-v1/2,plain/plain-v2/2,chat//0,raw//0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=268)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--model", default=None, help="a local HF model folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--case-file", default="default", help="a case file (default: the bundled default set)")
    args = parser.parse_args()
    model = args.model or real_model()
    n_threads = threads()
    print(f"{model}: first {args.cases} cases of {args.case_file}, batch {args.batch_size}, CPU, {n_threads} torch "
          "thread(s), ToolfidHFLM (stop at call end)", flush=True)
    lm = None
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants.split(","):
            style, template, demos = variant.split("/")
            meta = {"prompt_style": style, "demos": int(demos), **({"prompt_template": template} if template else {})}
            try:
                profile, metrics, lm = run_view(model, args.case_file, Path(tmp) / "home", stopping=True, lm=lm,
                                                batch_size=args.batch_size, limit=args.cases, extra_meta=meta)
            except SystemExit as exc:  # e.g. chat style on a model without a chat template
                print(f"  {variant:18s} not run: {exc}", flush=True)
                continue
            ctoks, n_calls = call_tokens(lm.tokenizer, profile.generations, profile.prompts)
            n = len(profile.generations)
            ptoks = sum(len(lm.tok_encode(p)) for p in profile.prompts.values()) / max(n, 1)
            print(f"  {variant:18s} json_valid_rate {metrics.get('json_valid_rate', float('nan')):.3f}  "
                  f"parse_rate {metrics.get('parse_rate', float('nan')):.3f}  n {n}  prompt tokens {ptoks:.0f}  "
                  f"emitted/call tokens {profile.emitted_tokens / max(ctoks, 1):.2f}  "
                  f"{profile.prefill_s + profile.decode_s:.0f} s", flush=True)
            for depth, sub in sorted((profile.summary.get("by_depth") or {}).items()):
                m = sub.get("metrics") or {}
                grounded = m.get("result_grounding_rate")
                print(f"    turn depth {depth:3s} n {sub.get('n'):3d}  json_valid_rate {m.get('json_valid_rate') or 0:.3f}"
                      + ("" if grounded is None else f"  result_grounding_rate {grounded:.3f}"), flush=True)


if __name__ == "__main__":
    main()
