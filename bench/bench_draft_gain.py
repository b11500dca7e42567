#!/usr/bin/env python
"""Benchmark: what verifying drafts costs by how much of them is accepted — the draft budget's bound (issue 37).

One base model, the shortest default cases (chat template; the fixture model: its own cases and prompts),
generated plainly; then verified against drafts made from those very answers, kept for their first ``m`` tokens
and random after them, so that every row's first verification pass gains ``min(m, 16)`` of the 16 draft tokens it
sends. Each row runs with every draft verified (``draft_probe_rows=0``: the engine before issue 37) and with the
draft budget on (the default: drafting stops after 8 probe rows when they gained less than ``draft_min_gain`` per
token sent). Rows run to ``--max-new`` tokens (no early stop at the call's end), in one batch. Prints CPU seconds
(this process's: the machine is shared) against plain decoding, the engine's forward passes and pass tokens,
and checks that every mode gives plain decoding's tokens. ``--repeat N``: the least of N runs' CPU times.

    OMP_NUM_THREADS=1 nice .venv/bin/python bench/bench_draft_gain.py --model smollm2 --cases 16
    OMP_NUM_THREADS=1 nice .venv/bin/python bench/bench_draft_gain.py --model fixture
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from _common import real_model, threads


def prompts_of(model: str, n: int) -> tuple[Any, Any, list[list[int]]]:
    """(model, tokenizer, prompt token ids) for ``n`` cases."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_toolfid.cases.load import load_cases

    if model == "fixture":
        from lm_eval_toolfid.cases.bundled import fixture_paths
        from lm_eval_toolfid.prompts.prompter import render_prompt
        from lm_eval_toolfid.prompts.settings import PromptSettings

        path = str(fixture_paths()["base"])
        texts = [render_prompt(c, PromptSettings(demos=0)) for c in load_cases("fixture")][:n]
        tok = AutoTokenizer.from_pretrained(path)
        ids = [tok(t)["input_ids"] for t in texts]
    else:
        from lm_eval_toolfid.prompts.prompter import Prompter

        path = real_model(model)
        tok = AutoTokenizer.from_pretrained(path)
        cases = load_cases("default")
        prompter = Prompter("chat", demos=0, model_args={"pretrained": path}, cases=cases)
        texts = sorted((prompter.render(c) for c in cases if not c.history), key=len)[:n]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return AutoModelForCausalLM.from_pretrained(path).eval(), tok, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="fixture, smollm2, qwen-coder, or a model folder")
    parser.add_argument("--cases", type=int, default=16)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--kept", default="1,3,6,10,16", help="draft tokens kept before the random ones (m)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each mode; the least CPU time is printed")
    args = parser.parse_args()
    n_threads = threads()

    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper, eos_token_ids

    model, tok, ids = prompts_of(args.model, args.cases)
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    n = len(ids)

    def run(drafts: list[list[int]] | None, **config: Any) -> tuple[float, list[Any], Any]:
        best = None
        for _ in range(args.repeat):  # new rows each time: a row's stopper keeps its state
            rows = [Row(prompt=p, max_new=args.max_new, draft=drafts[i] if drafts else (),
                        stopper=RowStopper(tok, eos, [], args.max_new, call_end=False)) for i, p in enumerate(ids)]
            engine = GreedyEngine(model, pad, EngineConfig(max_batch=n, **config))
            t0 = time.process_time()
            out = engine.run(rows)
            seconds = time.process_time() - t0
            best = seconds if best is None else min(best, seconds)
        return best, out, engine

    run(None)  # warm-up: the first use of each shape
    plain_s, out, plain_engine = run(None)
    plain = [r.tokens for r in out]
    rng = random.Random(0)
    vocab = model.config.vocab_size
    print(f"{args.model}: {n} cases, prompts {sum(map(len, ids)) / n:.0f} tokens on average, {args.max_new} new tokens "
          f"(answers {sum(map(len, plain)) / n:.1f} on average), one batch, CPU, {n_threads} torch thread(s)")
    print(f"  plain decoding: {plain_s:.2f} s CPU, {plain_engine.stats.forward_passes} passes, "
          f"{plain_engine.stats.padded_tokens} pass tokens")
    print(f"  {'kept m':>6s} {'gained/sent':>18s} | every draft verified (before) | draft budget (default)")
    for m in [int(x) for x in args.kept.split(",")]:
        drafts = [p[:m] + [rng.randrange(100, vocab) for _ in range(len(p) - m)] for p in plain]
        cells = []
        for config in ({"draft_probe_rows": 0}, {}):
            seconds, res, engine = run(drafts, **config)
            assert [r.tokens for r in res] == plain, f"m={m} {config}: tokens differ from plain decoding"
            budget = engine.draft_budgets.by_view.get(None) if engine.draft_budgets is not None else None
            cells.append((seconds, engine.stats, budget))
        always = cells[0][2]
        gain = f"{always.gained}/{always.sent} = {always.gained / max(1, always.sent):.2f}"
        line = f"  {m:>6d} {gain:>18s}"
        for seconds, stats, budget in cells:
            line += (f" | {seconds:6.2f} s ({seconds / plain_s:5.3f}x) {stats.forward_passes:>3d} passes "
                     f"{stats.padded_tokens:>6d} tok" + (f", {budget.dropped} rows decoded" if budget.dropped else ""))
        print(line)


if __name__ == "__main__":
    main()
