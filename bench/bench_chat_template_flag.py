#!/usr/bin/env python
"""Benchmark: a real model's base validity with and without lm-eval's ``--apply_chat_template``.

One base view of ``tool_use_fidelity`` (its default: plain-v3, one demonstration, for a model whose template ignores
``tools=``) per variant through lm-eval's ``simple_evaluate`` on one loaded ``ToolfidHFLM`` (toolfid's engine, as
``toolfid lm-eval`` runs): no flag, ``--apply_chat_template`` (lm-eval's CLI then turns ``--fewshot_as_multiturn``
on: the demonstration as turns), and ``--apply_chat_template --fewshot_as_multiturn false`` (one user turn).
Prints each variant's json_valid_rate and parse_rate over the same cases, and the paired change against no flag
(cases lost / gained, the exact McNemar p-value): "not worse by more than noise" is a change whose p-value is not
small.

Usage::

    .venv/bin/python bench/bench_chat_template_flag.py [--model smollm2|qwen-coder|DIR] [--limit 60]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from _common import real_model, threads


def view(lm, model: str, limit: int, **flags) -> dict[str, bool]:
    """case id → the base's answer valid, for one variant."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import tasks_path

    meta = {"pretrained": model, "write_reference": False}
    manager = TaskManager(include_path=str(tasks_path()), include_defaults=False, metadata=meta)
    out = simple_evaluate(model=lm, model_args={"pretrained": model}, tasks=["tool_use_fidelity"],
                          task_manager=manager, log_samples=True, bootstrap_iters=0, limit=limit, **flags)
    return {s["doc"]["id"]: s["cases_scored"]["ft"]["kind"] == "valid" for s in out["samples"]["tool_use_fidelity"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=60)
    args = parser.parse_args()
    threads()
    from lm_eval_toolfid.core.stats import mcnemar_exact_p
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    model = real_model(args.model)
    os.environ["TOOLFID_HOME"] = tempfile.mkdtemp()
    lm = ToolfidHFLM(pretrained=model, batch_size=16, device="cpu")
    # lm-eval's CLI turns --fewshot_as_multiturn on with --apply_chat_template unless told "false"
    variants = {"no flag": {},
                "--apply_chat_template": {"apply_chat_template": True, "fewshot_as_multiturn": True},
                "--apply_chat_template --fewshot_as_multiturn false": {"apply_chat_template": True,
                                                                       "fewshot_as_multiturn": False}}
    print(f"model {model}, first {args.limit} cases of the default set, base view (plain-v3, one demonstration)")
    plain = None
    for name, flags in variants.items():
        t0 = time.perf_counter()
        valid = view(lm, model, args.limit, **flags)
        seconds = time.perf_counter() - t0
        rate = sum(valid.values()) / len(valid)
        line = f"{name:54s} json_valid_rate {rate:.3f} ({sum(valid.values())}/{len(valid)})  {seconds:.0f} s"
        if plain is None:
            plain = valid
        else:
            deltas = [int(valid[c]) - int(plain[c]) for c in plain]
            lost, gained = deltas.count(-1), deltas.count(1)
            line += f"  vs no flag: {lost} lost, {gained} gained, McNemar p {mcnemar_exact_p(deltas):.2g}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
