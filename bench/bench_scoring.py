#!/usr/bin/env python
"""Benchmark: scoring core throughput (calls/s) and its share of a real run's time.

1. Throughput: ``score_generation`` + ``pair`` over the 268 single-turn default cases x 6 generation shapes
   (valid gold call, schema error, hallucinated name, prose, truncated JSON, fenced call),
   repeated; prints scored generations per second (target >= 20,000/s).
2. Share: one real base view of the fixture task (lm-eval ``simple_evaluate`` on the bundled
   tiny model, the fastest model there is, so the share is an upper bound) is timed end to end;
   its generations are then re-scored and timed; prints scoring time / view time (target <= 1%).

Usage: ``nice -n 10 .venv/bin/python bench/bench_scoring.py [--repeat 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def corpus(cases):
    out = []
    for c in cases:
        gold = {"name": c.gold_tool_name, "arguments": c.gold_arguments or {}}
        out += [
            (json.dumps(gold), c),
            (json.dumps({"name": c.gold_tool_name, "arguments": {"zz_unknown": [1, 2, {"a": None}]}}), c),
            (json.dumps({"name": c.gold_tool_name + "_v2", "arguments": gold["arguments"]}), c),
            ("Sure! I will take care of that for you right away.", c),
            (json.dumps(gold)[:-7], c),
            ("Here you go:\n```json\n" + json.dumps(gold) + "\n```\nanything else?", c),
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.scoring.compare import pair
    from lm_eval_toolfid.scoring.outcome import score_generation

    cases = [c for c in load_cases("default") if not c.history]  # single-turn: one gold call each
    items = corpus(cases)
    for text, case in items:  # one warm-up pass (caches, lazily built validators)
        score_generation(text, case)
    start = time.perf_counter()
    for _ in range(args.repeat):
        for text, case in items:
            ft = score_generation(text, case)
            pair(case.id, ft, ft)
    elapsed = time.perf_counter() - start
    n = len(items) * args.repeat
    print(f"scoring core: {n} generations ({len(cases)} single-turn default cases x 6 shapes x {args.repeat})")
    print(f"  throughput: {n / elapsed:10.0f} scored generations/s  (target >= 20000)")
    for shape, label in enumerate(("valid gold call", "schema error", "hallucinated name", "prose",
                                   "truncated JSON", "fenced call")):
        sub = items[shape::6]
        start = time.perf_counter()
        for text, case in sub:
            score_generation(text, case)
        print(f"    {label:18s} {len(sub) / (time.perf_counter() - start):10.0f} /s")

    import lm_eval.evaluator
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path

    lm_eval.evaluator.get_git_commit_hash = lambda: None
    task = "tool_use_fidelity_fixture"
    base = fixture_paths()["base"]
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        os.environ["TOOLFID_HOME"] = home
        start = time.perf_counter()
        lm = HFLM(pretrained=base, batch_size=16, device="cpu")
        manager = TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata={"pretrained": base})
        out = simple_evaluate(model=lm, model_args={"pretrained": base}, tasks=[task], task_manager=manager,
                              log_samples=True, bootstrap_iters=0)
        view = time.perf_counter() - start
    samples = out["samples"][task]
    fixture_cases = {c.id: c for c in load_cases("fixture")}
    gens = [(s["resps"][0][0], fixture_cases[s["doc"]["id"]]) for s in samples]
    start = time.perf_counter()
    for text, case in gens:
        ft = score_generation(text, case)
        pair(case.id, ft, ft)
    scoring = time.perf_counter() - start
    print(f"one fixture-model view ({len(gens)} cases, model load + generation + scoring): {view:7.2f} s")
    print(f"  scoring its generations (base + adapter side): {scoring * 1000:7.2f} ms")
    print(f"  scoring share of the view: {100 * scoring / view:7.3f} %  (target <= 1%)")


if __name__ == "__main__":
    main()
