#!/usr/bin/env python
"""Benchmark: the host's cost per verified token, token by token vs the draft's shared walk, in one run.

A verified adapter row takes the base's tokens its model agrees with. Token by token, each one goes through the
row's stopper (decode window, the call-end scanner) on the host: microseconds a token, which a GPU waits for between
passes, and a leaderboard pays once per case *per adapter*. With the shared walk
(``engine/acceptance.py``, ``RowStopper.decisions``), the rows of every view verifying the same draft under the same
stop rule read where it stops from one walk of it, and take their matching tokens at once.

Here: the default case set's expected calls as a plain-v3 row writes them (the primer in the prompt, the rest of the
call, then the block separator), tokenized by the real model's tokenizer as drafts; ``--views`` adapter views each
verify every draft in the engine's chunks, every prediction agreeing (a B = 0 adapter: the most verified tokens a run
can have). Prints, per mode, host microseconds per verified token and the ratio, both measured in this run, and what
that is for ``--views`` views of the default set; and checks that both modes took the same tokens and stops.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_accept.py --model smollm2 --views 100
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from _common import real_model


class OneByOne:
    """The row's stopper without its shared walk: every token pushed (what verification did before)."""

    def __init__(self, stopper) -> None:  # noqa: ANN001
        self.stopper = stopper

    def push(self, token: int) -> str | None:
        return self.stopper.push(token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--views", type=int, default=100)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.engine.acceptance import accept_predictions
    from lm_eval_toolfid.engine.config import EngineConfig
    from lm_eval_toolfid.engine.handoffs import RowState
    from lm_eval_toolfid.engine.rows import LiveRow, Row, RowResult
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper
    from lm_eval_toolfid.prompts.settings import PRIMER, STOP_SEQUENCES

    tok = AutoTokenizer.from_pretrained(real_model(args.model), local_files_only=True)
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    cases = [c for c in load_cases(None) if len(c.expected_calls) == 1]
    drafts = []
    for case in cases:
        call = case.expected_calls[0]
        text = json.dumps({"name": call.name, "arguments": call.arguments or {}})[len(PRIMER):] + STOP_SEQUENCES[0]
        drafts.append(tok.encode(text, add_special_tokens=False))
    chunk = EngineConfig().first_chunk

    def run(wrap: bool) -> tuple[float, int, list]:
        results, tokens = [], 0
        t = time.perf_counter()
        for _ in range(args.views):
            for draft in drafts:
                stopper = RowStopper(tok, eos, STOP_SEQUENCES, 128, call_end=True, prefix=PRIMER)
                live = LiveRow(0, Row(prompt=[0], stopper=OneByOne(stopper) if wrap else stopper, max_new=128,
                                      draft=draft), RowResult())
                state = accept_predictions(live, [(draft[0], 1.0)], verified=False, near_tie=1e-3, record=False)
                while state is RowState.VERIFY:
                    pos = len(live.result.tokens)
                    state = accept_predictions(live, [(d, 1.0) for d in draft[pos:pos + chunk]], verified=True,
                                               near_tie=1e-3, record=False)
                tokens += live.result.verified
                results.append(live.result)
        seconds = time.perf_counter() - t
        return seconds, tokens, [dataclasses.astuple(dataclasses.replace(r, deferred=0)) for r in results]

    run(True)  # the tokenizer's decode windows warm, as in every view after the first
    one_s, one_tokens, one = run(True)
    shared_s, shared_tokens, shared = run(False)
    same = one == shared
    per_one, per_shared = one_s / one_tokens * 1e6, shared_s / shared_tokens * 1e6
    print(f"{args.model}: {len(drafts)} single-call cases x {args.views} views, {one_tokens} verified tokens")
    print(f"  token by token: {one_s:.3f} s host, {per_one:.2f} us a verified token")
    print(f"  shared walk:    {shared_s:.3f} s host, {per_shared:.2f} us a verified token "
          f"({one_s / shared_s:.1f}x less)")
    print(f"  same tokens, counts and stops in both modes: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
