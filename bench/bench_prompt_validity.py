#!/usr/bin/env python
"""Benchmark: base json_valid_rate / parse_rate of a real model per plain-prompt variant.

Generates with ``ToolfidHFLM`` (stop at call end; the same generation path as a task run) on the
first N default cases for each variant (template plain-v1 = JSON Schema lines, plain-v2 = compact
signatures; number of demos) and scores with the task's own ``score_generation``.

Usage: ``nice -n 10 .venv/bin/python bench/bench_prompt_validity.py [--cases 40] [--variants plain-v1:2,plain-v2:2]``
"""

from __future__ import annotations

import argparse
import collections
import time

from _common import real_model, threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--variants", default="plain-v1:2,plain-v2:2")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-gen-toks", type=int, default=192)
    parser.add_argument("--model", default=None)
    parser.add_argument("--show", type=int, default=0, help="print this many generations per variant")
    args = parser.parse_args()
    model = args.model or real_model()
    n_threads = threads()

    from lm_eval_toolfid.cases import load_cases
    from lm_eval_toolfid.hflm import ToolfidHFLM
    from lm_eval_toolfid.prompting import PromptSettings, render_prompt
    from lm_eval_toolfid.scoring import score_generation

    lm = ToolfidHFLM(pretrained=model, batch_size=args.batch_size, device="cpu")
    cases = load_cases("default")[args.offset:args.offset + args.cases]
    gen = {"until": ["\n###"], "do_sample": False, "max_gen_toks": args.max_gen_toks}

    class Req:
        def __init__(self, prompt: str) -> None:
            self.args = (prompt, dict(gen))

    print(f"{model}: {len(cases)} default cases from #{args.offset}, batch {args.batch_size}, CPU, {n_threads} torch thread(s)")
    for variant in args.variants.split(","):
        template, demos = variant.split(":")
        settings = PromptSettings(demos=int(demos), template=template)
        prompts = [render_prompt(c, settings) for c in cases]
        start = time.perf_counter()
        texts = lm.generate_until([Req(p) for p in prompts], disable_tqdm=True)
        elapsed = time.perf_counter() - start
        outcomes = [score_generation(t, c) for t, c in zip(texts, cases)]
        kinds = collections.Counter(o.kind.value for o in outcomes)
        n = len(cases)
        ptoks = sum(len(lm.tok_encode(p)) for p in prompts) / n
        print(f"  {template} demos={demos}: json_valid_rate {kinds['valid'] / n:.3f}  parse_rate "
              f"{sum(o.kind.parsed for o in outcomes) / n:.3f}  {dict(kinds)}  prompt tokens {ptoks:.0f}  "
              f"{elapsed:.0f} s")
        for t in texts[:args.show]:
            print("     |", t[:300].replace("\n", "\\n"))


if __name__ == "__main__":
    main()
