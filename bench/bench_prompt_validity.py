#!/usr/bin/env python
"""Benchmark: a real model's base validity per prompt style, what ``auto`` picks, and how each style fails.

Each variant is one base view of the ``tool_use_fidelity`` task through lm-eval's
``simple_evaluate`` on one loaded ``ToolfidHFLM`` (what ``toolfid run`` does: stop at the end
of the call), scored by the task itself. A variant is ``auto`` (the task's default: no style given)
or ``style/template/demos``: ``plain/plain-v3/1`` (the plain default), ``plain/plain-v1/2`` (the
original), ``plain/plain-v2/2`` (signatures), ``chat//0`` (the model's own chat template with the
case's tools), ``raw//0``.

Prints per model what ``auto`` picks and why, then per variant: json_valid_rate, parse_rate,
gold_tool_rate, gold_args_match_rate, mean prompt tokens, emitted tokens / tokens of the calls, the
view's wall time, and the failure shapes counted from the per-case records
(:mod:`lm_eval_toolfid.reporting.shapes`: other format than the prompt asks for, schema copied into
arguments, invented optional values, no call, ...).

Usage::

    .venv/bin/python bench/bench_prompt_validity.py [--model smollm2|qwen-coder|gemma3|DIR[,...]]
        [--cases 268 | --every 11] [--variants auto,plain/plain-v3/1,chat//0] [--pick-only]
        [--case-file FILE]

``--cases N`` takes the first N cases of the default set, ``--every K`` every K-th (``--every 11``: the
24 cases of issue 16); plain-v3 examples always come from all 268. ``--pick-only`` prints only what
``auto`` picks for each model (no generation: seconds).

``--case-file`` names another case file than the default set; a case file with conversations also gets
its validity and result grounding per turn depth.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import call_tokens, real_model, run_view, threads

DEFAULT_VARIANTS = "auto,plain/plain-v3/1,plain/plain-v1/2,plain/plain-v2/2,chat//0,raw//0"


def pick(model: str) -> str:
    from lm_eval_toolfid.prompts.prompter import Prompter

    prompter = Prompter("auto", demos=None, model_args={"pretrained": model}, template="plain-v3", plain_demos=1)
    extra = ""
    if prompter.chat is not None:
        extra = (f" [end of turn {prompter.chat.end_of_turn!r}; system prompt inserted: "
                 f"{prompter.chat.system_prompt_inserted(None)!r}]")
    return f"auto -> {prompter.settings.style}: {prompter.choice.reason}{extra}"


def shapes_line(profile) -> str:  # noqa: ANN001 - a _common.Profile
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.core.records import PairScore
    from lm_eval_toolfid.reporting.shapes import count_shapes

    cases = {c.id: c for c in load_cases("default")}
    views = [(PairScore.model_validate(r).ft, cases[cid]) for cid, r in profile.records.items() if r]
    counts = count_shapes(views, profile.toolfid.get("expected_format"))
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=268, help="the first N default cases")
    parser.add_argument("--every", type=int, default=0,
                        help="every K-th default case instead (the K-th, 2K-th, ...; K > 1)")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--model", default="smollm2",
                        help="smollm2, qwen-coder, gemma3 or a local HF model folder; several: comma-separated")
    parser.add_argument("--pick-only", action="store_true", help="only print what auto picks for each model")
    parser.add_argument("--case-file", default="default", help="a case file (default: the bundled default set)")
    args = parser.parse_args()
    models = [real_model(m) for m in args.model.split(",")]
    for model in models:
        print(f"{model}: {pick(model)}", flush=True)
    if args.pick_only:
        return
    n_threads = threads()
    from lm_eval_toolfid.cases.load import load_cases

    total = len(load_cases(args.case_file))
    samples = list(range(args.every - 1, total, args.every)) if args.every > 1 else None  # the K-th, 2K-th…
    which = f"every {args.every}th case of {args.case_file} ({len(samples)})" if samples else f"first {args.cases} cases of {args.case_file}"
    for model in models:
        print(f"\n{model}: {which}, batch {args.batch_size}, CPU, {n_threads} torch thread(s), "
              "ToolfidHFLM (stop at call end)", flush=True)
        lm = None
        with tempfile.TemporaryDirectory() as tmp:
            for variant in args.variants.split(","):
                if variant == "auto":
                    meta: dict = {}
                else:
                    style, template, demos = variant.split("/")
                    meta = {"prompt_style": style, "demos": int(demos), **({"prompt_template": template} if template else {})}
                try:
                    profile, metrics, lm = run_view(model, args.case_file, Path(tmp) / "home", stopping=True, lm=lm,
                                                    batch_size=args.batch_size, limit=None if samples else args.cases,
                                                    samples=samples, extra_meta=meta)
                except SystemExit as exc:  # e.g. chat style on a model without a chat template
                    print(f"  {variant:18s} not run: {exc}", flush=True)
                    continue
                ctoks, _ = call_tokens(lm.tokenizer, profile.generations, profile.prompts)
                n = len(profile.generations)
                ptoks = sum(len(lm.tok_encode(p)) for p in profile.prompts.values()) / max(n, 1)
                style = profile.toolfid.get("prompt_style")
                label = f"{variant} ({style})" if variant == "auto" else variant
                print(f"  {label:18s} json_valid_rate {metrics.get('json_valid_rate', float('nan')):.3f}  "
                      f"parse_rate {metrics.get('parse_rate', float('nan')):.3f}  "
                      f"gold_tool {metrics.get('gold_tool_rate', float('nan')):.3f}  "
                      f"gold_args {metrics.get('gold_args_match_rate', float('nan')):.3f}  n {n}  "
                      f"prompt tokens {ptoks:.0f}  emitted/call tokens {profile.emitted_tokens / max(ctoks, 1):.2f}  "
                      f"{profile.prefill_s + profile.decode_s:.0f} s", flush=True)
                print(f"  {'':18s} shapes (asks for {profile.toolfid.get('expected_format')}): {shapes_line(profile)}",
                      flush=True)
                for depth, sub in sorted((profile.summary.get("by_depth") or {}).items()):
                    m = sub.get("metrics") or {}
                    grounded = m.get("result_grounding_rate")
                    print(f"    turn depth {depth:3s} n {sub.get('n'):3d}  json_valid_rate {m.get('json_valid_rate') or 0:.3f}"
                          + ("" if grounded is None else f"  result_grounding_rate {grounded:.3f}"), flush=True)


if __name__ == "__main__":
    main()
