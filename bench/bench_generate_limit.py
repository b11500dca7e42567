#!/usr/bin/env python
"""Benchmark: tokens/s of a toolfid view vs bare HF ``generate`` on the same prompts and batches.

Loads SmolLM2-135M-Instruct once (``ToolfidHFLM``), runs one base view of the default task
(first ~8 cases, the task's default prompt: plain-v3, 1 demo) through lm-eval's ``simple_evaluate`` and times it (everything
but the model load: prompt rendering, lm-eval's request building, tokenising, generating,
scoring, aggregation). Then calls ``model.generate`` directly on the same prompts in the same
batches (lm-eval's order: longest first), with the same stopping criteria (the task's per-row rule, the
prompt's primer included) and token budget.
Prints computed tokens/s of each and the ratio (target: the view within 15% of bare generate).

Usage: ``nice -n 10 .venv/bin/python bench/bench_generate_limit.py [--cases 8] [--batch-size 8]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import Profile, real_model, run_view, threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    model = args.model or real_model()
    n_threads = threads()

    import torch
    from transformers import StoppingCriteriaList

    from lm_eval_toolfid.prompts.plain import restore_primer
    from lm_eval_toolfid.integrations.lm_eval.stopping import make_stopping_criteria
    from lm_eval.models.utils_hf import stop_sequences_criteria

    with tempfile.TemporaryDirectory() as tmp:
        profile, _, lm = run_view(model, "default", Path(tmp) / "home", stopping=True, batch_size=args.batch_size,
                                  limit=args.cases)
        view_s = profile.total_s - profile.load_s

        prompts = list(profile.prompts.values())  # exactly what the task view generated from
        lengths = [len(lm.tok_encode(p)) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
        bare = Profile()
        start = time.perf_counter()
        for b in range(0, len(order), args.batch_size):
            batch = [prompts[i] for i in order[b:b + args.batch_size]]
            ids, mask = lm.tok_batch_encode(batch)
            until = ["\n###", lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)]
            criteria = stop_sequences_criteria(lm.tokenizer, until, ids.shape[1], ids.shape[0])
            # the task's stop rule per row: the primer a plain-v3 prompt ends with is part of the text it reads
            criteria.append(make_stopping_criteria(lm.tokenizer, ids.shape[1], ids.shape[0], until,
                                                   prefixes=[restore_primer(p, "") for p in batch]))
            with torch.no_grad():
                out = lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=192, do_sample=False,
                                        stopping_criteria=StoppingCriteriaList(criteria),
                                        pad_token_id=lm.tokenizer.pad_token_id, use_cache=True)
            bare.compute_tokens += (out.shape[1] - ids.shape[1]) * out.shape[0]
        bare_s = time.perf_counter() - start

    run_tps = profile.compute_tokens / view_s
    bare_tps = bare.compute_tokens / bare_s
    print(f"SmolLM2-135M-Instruct, {args.cases} default cases, batch {args.batch_size}, CPU, {n_threads} torch thread(s)")
    print(f"  toolfid view (simple_evaluate, ToolfidHFLM): {profile.compute_tokens:6d} tokens in {view_s:7.1f} s "
          f"= {run_tps:7.1f} tok/s")
    print(f"  bare model.generate, same batches:          {bare.compute_tokens:6d} tokens in {bare_s:7.1f} s "
          f"= {bare_tps:7.1f} tok/s")
    print(f"  view / bare tokens/s: {run_tps / bare_tps:.3f}  (target >= 0.85)")


if __name__ == "__main__":
    main()
