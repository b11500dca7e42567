#!/usr/bin/env python
"""Benchmark: grouped-query attention folded over the unexpanded KV cache vs expanded per pass (CPU).

One model, the first N default cases in the style given; per setting (fold off, then on) three engine runs:
the base view with shared prefixes, a B = 0 LoRA's view verified against those answers with shared prefixes,
and the same without them. Prints wall seconds, and per run whether every case's tokens and every token's
top-two logit gap are identical bit for bit with and without the fold (the fold is used only where it is
bitwise equal: :mod:`lm_eval_toolfid.engine.attention`).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_gqa_fold.py --model qwen-coder --cases 32 --style chat
    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_gqa_fold.py --model smollm2 --cases 24 --style plain
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

from _common import real_model, threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen-coder", help="smollm2, qwen-coder, gemma3 or a model folder")
    parser.add_argument("--cases", type=int, default=32)
    parser.add_argument("--style", default="chat", help="chat (its template with the tools) or plain (plain-v3)")
    parser.add_argument("--max-new", type=int, default=96)
    args = parser.parse_args()
    n_threads = threads()
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper, eos_token_ids

    path = Path(real_model(args.model))
    tok = AutoTokenizer.from_pretrained(path)
    cases = load_cases("default")[:args.cases]
    prompter = Prompter(args.style, demos=0 if args.style == "chat" else 1, model_args={"pretrained": str(path)},
                        cases=cases)
    prompts = [tok(prompter.render(c))["input_ids"] for c in cases]
    model = AutoModelForCausalLM.from_pretrained(path)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(model, lora, adapter_name="zero").eval()  # B = 0: the base's outputs
    eos = eos_token_ids(model, tok)
    stop = [tok.eos_token] if args.style == "chat" else ["\n###"]

    def run(fold: bool, share: bool, drafts: list[list[int]] | None = None) -> tuple[float, list[Any]]:
        rows = [Row(prompt=p, max_new=args.max_new, draft=drafts[i] if drafts else (),
                    stopper=RowStopper(tok, eos, stop, args.max_new, call_end=True)) for i, p in enumerate(prompts)]
        with model.disable_adapter() if drafts is None else contextlib.nullcontext():
            engine = GreedyEngine(model, tok.pad_token_id, EngineConfig(max_batch=64, share_prefixes=share,
                                                                          fold_gqa=fold, record_gaps=True))
            t0 = time.perf_counter()
            results = engine.run(rows)
            return time.perf_counter() - t0, results

    out: dict[bool, list[list[Any]]] = {}
    print(f"{path.name}, the first {len(prompts)} default cases, {args.style}, {n_threads} torch thread(s)")
    for fold in (False, True):
        wb, base = run(fold, True)
        drafts = [r.tokens for r in base]
        wv, ver = run(fold, True, drafts)
        wu, unshared = run(fold, False, drafts)
        out[fold] = [base, ver, unshared]
        print(f"  fold {'on ' if fold else 'off'}: base view (shared prefixes) {wb:7.1f} s, B = 0 verified (shared) "
              f"{wv:7.1f} s, B = 0 verified (not shared) {wu:7.1f} s", flush=True)
    for i, label in enumerate(("base view", "B = 0 verified, shared", "B = 0 verified, not shared")):
        a, b = out[False][i], out[True][i]
        print(f"  {label}: tokens identical {sum(x.tokens == y.tokens for x, y in zip(a, b))}/{len(a)}, "
              f"top-two gaps bitwise identical {sum(x.gaps == y.gaps for x, y in zip(a, b))}/{len(a)}")


if __name__ == "__main__":
    main()
