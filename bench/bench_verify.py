#!/usr/bin/env python
"""Benchmark: adapter views verified against the base's answers vs decoded again (issue #15).

One process, one loaded model (``ModelSession``, what ``toolfid run`` does): the base view, then
each adapter view twice — verified (the default) and with ``verify: false`` — alternating, so both
see the same machine. Adapters:

- ``zero``: a fresh LoRA (B = 0): its outputs are the base's, token for token;
- ``trained``: a LoRA trained for a few CPU steps (changes some answers) — on the fixture, its
  ``faithful`` adapter;
- ``broken``: a LoRA trained to answer in prose (wrong from the first token) — on the fixture, ``broken``;
- ``early``: drafts rejected early — on the fixture its ``hallucinating`` adapter (the base's first token, then
  another tool: a first verification pass gains about 5 of its 16 tokens); on a real model the ``trained``
  LoRA's update taken whole.

Each adapter view runs verified (the default: the engine stops drafting where drafts are rejected early,
``engine/scheduler.py``), verified with drafting never stopped (``draft_probe_rows=0``: the engine before
issue 37) and unverified. Prints per view: wall and CPU seconds, the ratio to the base view, verified ÷
unverified, tokens accepted / decoded, the rows the draft budget decoded instead, near ties, and how many cases'
generations differ between verified and unverified (must be 0, or near ties); then each mode's forward passes
and pass tokens. Also the view's own prompt processing (one forward pass over every prompt, no decoding) against
the ``zero`` view, and, with ``--nulls K``, a K-null calibration
(``ModelSession.calibrate_nulls``) verified vs not. Targets: ``zero`` ≤ 0.45× the base view and ≤ 1.2× its
prompt processing; ``broken`` and ``early`` verified ≤ 1.05× unverified.

    nice .venv/bin/python bench/bench_verify.py --model fixture --nulls 2
    nice .venv/bin/python bench/bench_verify.py --model qwen --cases 12 --nulls 1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from _common import Clock, subset_file, threads

QWEN = "qwen2.5-coder-0.5b-instruct"


PROSE = ("The river bends slowly past the old mill, where swallows nest under the eaves every spring.",
         "She poured the tea, watched the steam curl, and said nothing for a long while.",
         "In winter the harbour freezes at the edges and the fishing boats stay tied up for weeks.",
         "A good loaf needs time: flour, water, salt, and a patient night in a cool kitchen.")


def lora_like(base: str, target: Path, kind: str, prompts: list[str] | None = None) -> Path:
    """A PEFT LoRA folder (r=8 on q/v), cached: ``zero`` (B = 0); ``trained`` (three steps on answers
    that call another tool, the update scaled to a quarter: changes some answers); ``early`` (the same
    steps, the whole update: starts as the base does, then calls the other tool, so its drafts are
    rejected early); ``prose`` (eight steps on prose answers: wrong from the first token)."""
    if (target / "adapter_model.safetensors").is_file():
        return target
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    if kind != "zero":
        tok = AutoTokenizer.from_pretrained(base)
        tok.padding_side = "right"
        if kind in ("trained", "early"):
            answers = ['<tool_call>\n{"name": "lookup_record", "arguments": {"query": "everything"}}\n</tool_call>'] * 4
            steps, lr, scale = 3, 1e-3, 0.25 if kind == "trained" else 1.0
        else:
            answers, steps, lr, scale = list(PROSE), 8, 2e-3, 1.0
        texts = [p + a + tok.eos_token for p, a in zip(prompts or [], answers)]
        batch = tok(texts, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        model.train()
        for _ in range(steps):
            model(**batch, labels=labels).loss.backward()
            optim.step()
            optim.zero_grad()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.mul_(scale)
    model.save_pretrained(target)
    return target


def generations(view: Any) -> dict[str, str]:
    return {s["doc"]["id"]: s["resps"][0][0] for s in view.samples}


def record(view: Any, task: str) -> dict:
    return view.results["configs"][task]["metadata"]["toolfid"].get("generation", {})


def prompt_processing(session: Any, prompts: list[str]) -> Clock:
    """One forward pass over every prompt (the engine's prefill, one token each), no decoding."""
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row

    class One:
        def push(self, token: int) -> str:
            return "length"

    lm = session.lm
    ids = [lm.tok_batch_encode([p])[0][0].tolist() for p in prompts]
    engine = GreedyEngine(lm.model, lm.tokenizer.pad_token_id, EngineConfig(max_batch=len(ids)))
    with Clock() as c:
        engine.run([Row(prompt=p, stopper=One(), max_new=1) for p in ids])
    return c


def pass_cost(session: Any) -> tuple[int, int]:
    """The last engine run's forward passes and padded tokens of its prompt and draft passes."""
    stats = session.lm.engine_stats
    return (stats.forward_passes, stats.padded_tokens) if stats is not None else (0, 0)


@contextlib.contextmanager
def always_drafting() -> Iterator[None]:
    """Views generated while this is open draft every row (``draft_probe_rows=0``): the engine before issue 37."""
    import lm_eval_toolfid.integrations.lm_eval.hf_model as hf_model

    saved = hf_model.EngineConfig
    hf_model.EngineConfig = functools.partial(saved, draft_probe_rows=0)  # type: ignore[misc]
    try:
        yield
    finally:
        hf_model.EngineConfig = saved  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="fixture", help="fixture, qwen, or a model folder")
    parser.add_argument("--cases", type=int, default=12, help="first N default cases (real models)")
    parser.add_argument("--batch-size", default="auto")
    parser.add_argument("--nulls", type=int, default=0, help="K null adapters per multiplier for the calibration row")
    parser.add_argument("--skip-generate", action="store_true",
                        help="real models: leave out the base view through transformers' generate")
    parser.add_argument("--generate-batch", type=int, default=8, help="batch of that generate view (default 8)")
    args = parser.parse_args()
    n_threads = threads()

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.core.fsutil import toolfid_home
    from scripts.real_models import models_dir
    from lm_eval_toolfid.run.plan import ModelOptions, View
    from lm_eval_toolfid.run.session import ModelSession

    cache = toolfid_home() / "bench-adapters"
    real_model = str(models_dir() / QWEN) if args.model == "qwen" else args.model
    tmp = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    os.environ["TOOLFID_HOME"] = str(tmp / "home")
    batch = int(args.batch_size) if args.batch_size.isdigit() else args.batch_size
    if args.model == "fixture":
        fx = fixture_paths()
        base, task = str(fx["base"]), "tool_use_fidelity_fixture"
        meta: dict[str, Any] = {}
        adapters = {"zero": str(lora_like(base, cache / "fixture-zero", "zero")),
                    "trained": str(fx["adapters"]["faithful"]), "broken": str(fx["adapters"]["broken"]),
                    "early": str(fx["adapters"]["hallucinating"])}
        from lm_eval_toolfid.cases.load import load_cases

        label = f"fixture model ({len(load_cases('fixture'))} cases)"
    else:
        base = real_model
        task = "tool_use_fidelity_chat"
        meta = {"cases": str(subset_file(args.cases, tmp / "cases.jsonl"))}
        from lm_eval_toolfid.cases.load import load_cases
        from lm_eval_toolfid.prompts.prompter import Prompter

        others = load_cases("default")[-4:]  # the trained LoRA learns on cases outside the measured ones
        train = [Prompter("chat", demos=0, model_args={"pretrained": base}, cases=others).render(c) for c in others]
        name = Path(base).name
        adapters = {"zero": str(lora_like(base, cache / f"{name}-zero", "zero")),
                    "trained": str(lora_like(base, cache / f"{name}-trained-quarter", "trained", train)),
                    "broken": str(lora_like(base, cache / f"{name}-prose", "prose", train)),
                    "early": str(lora_like(base, cache / f"{name}-trained-whole", "early", train))}
        label = f"{name} ({args.cases} default cases, chat template)"

    # "default" is the trained adapter: calibration swaps null weights of its shape into it
    import logging

    from lm_eval_toolfid.reporting.progress import Progress

    logging.getLogger("lm_eval.toolfid").disabled = True  # verdict lines are not this benchmark's output
    quiet = Progress(["views"], enabled=False)
    session = ModelSession(base, ModelOptions(batch_size=batch, device="cpu"), progress=quiet, verbose=False).load(
        {"trained": adapters["trained"], **{k: v for k, v in adapters.items() if k != "trained"}})
    engine_s: dict[str, float] = {}

    def engine_time(key: str, before: float) -> None:
        engine_s[key] = session.lm.engine_seconds - before

    before = session.lm.engine_seconds
    with Clock() as base_clock:
        with session.base_view():
            base_view = session.evaluate_current(View("base", None, meta), task)
    engine_time("base", before)
    old_clock = None
    if args.model != "fixture" and not args.skip_generate:  # the path before the engine, same cases
        session.lm.use_engine, saved = False, session.lm.batch_size_per_gpu
        session.lm.batch_size_per_gpu = args.generate_batch  # lm-eval's own auto would probe 32k-token rows
        with Clock() as old_clock:
            with session.base_view():
                session.evaluate_current(View("base-generate", None, {**meta, "write_reference": False}), task)
        session.lm.use_engine, session.lm.batch_size_per_gpu = True, saved
    base_rec = record(base_view, task)
    from lm_eval_toolfid.pairing.samples import sample_prompt

    prompts = [sample_prompt(s) or "" for s in base_view.samples]
    session.activate("zero")
    prefill = prompt_processing(session, prompts)

    rows = []
    for name in [n for n in ("zero", "trained", "broken", "early") if n in adapters]:
        session.activate("default" if name == "trained" else name)
        before = session.lm.engine_seconds
        with Clock() as v:
            verified = session.evaluate_current(View(name, adapters[name], meta), task)
        engine_time(name, before)
        passes = [pass_cost(session)]
        with always_drafting(), Clock() as a:
            always = session.evaluate_current(View(name, adapters[name], meta), task)
        passes.append(pass_cost(session))
        with Clock() as p:
            plain = session.evaluate_current(View(name, adapters[name], {**meta, "verify": False}), task)
        passes.append(pass_cost(session))
        gv, gp, ga = generations(verified), generations(plain), generations(always)
        differ = sum(gv[k] != gp.get(k) or ga.get(k) != gp.get(k) for k in gv)
        rows.append((name, v, a, p, record(verified, task), differ, len(gv), passes))

    print(f"{label}, batch {args.batch_size} (ran {base_rec.get('decode_batch')}), CPU, {n_threads} torch thread(s)")
    print(f"  base view: {base_clock.wall:.1f} s wall, {base_clock.cpu:.1f} s CPU ({engine_s['base']:.1f} s in the "
          f"engine); {base_rec.get('tokens')} tokens")
    if old_clock is not None:
        print(f"  base view through transformers' generate (the path before the engine): {old_clock.wall:.1f} s wall, "
              f"{old_clock.cpu:.1f} s CPU")
    print(f"  prompt processing of the view (one forward pass per prompt, no decoding): "
          f"{prefill.wall:.1f} s wall, {prefill.cpu:.1f} s CPU")
    print(f"  {'adapter':8s} {'verified':>17s} {'always drafting':>17s} {'unverified':>17s} {'v/base':>7s}"
          f" {'u/base':>7s} {'v/u':>6s} {'always/u':>8s} {'accepted/decoded tokens':>24s} {'rows decoded':>13s}"
          f" {'near ties':>10s} {'cases differ':>12s}")
    for name, v, a, p, rec, differ, n, _ in rows:
        stop = rec.get("drafting_stopped") or {}
        dropped = (f"{rec.get('rows_draft_dropped', 0)} (after {stop['after_rows']})" if stop
                   else str(rec.get("rows_draft_dropped", 0)))
        print(f"  {name:8s} {v.wall:7.1f} s ({v.cpu:5.1f} cpu) {a.wall:7.1f} s ({a.cpu:5.1f} cpu) "
              f"{p.wall:7.1f} s ({p.cpu:5.1f} cpu) "
              f"{v.wall / base_clock.wall:7.3f} {p.wall / base_clock.wall:7.3f} {v.wall / p.wall:6.3f}"
              f" {a.wall / p.wall:8.3f}"
              f" {rec.get('tokens_accepted', 0):>11d}/{rec.get('tokens_decoded', 0):<12d} {dropped:>13s}"
              f" {rec.get('near_tie_tokens', 0):>4d} tok/{rec.get('near_tie_cases', 0)} case"
              f" {differ:>5d} of {n}")
        if stop:
            print(f"  {'':8s} drafting stopped after {stop['after_rows']} rows: {stop['reason']}")
    print("  the engine's passes (forward passes, and tokens of prompt and draft passes with padding; one engine run"
          " per view):")
    for name, *_, passes in rows:
        print(f"  {name:8s} " + "; ".join(f"{mode} {n} passes, {t} pass tokens" for mode, (n, t) in
                                          zip(("verified", "always drafting", "unverified"), passes)))
    zero = rows[0][1]
    print(f"  zero ÷ base view: {zero.wall / base_clock.wall:.3f} wall, {zero.cpu / base_clock.cpu:.3f} CPU "
          f"(target ≤ 0.45; the base view's own prompt processing is {prefill.wall / base_clock.wall:.3f} of it)")
    if old_clock is not None:
        print(f"  zero ÷ base view through generate: {zero.wall / old_clock.wall:.3f} wall, "
              f"{zero.cpu / old_clock.cpu:.3f} CPU")
    print(f"  zero ÷ prompt processing: {zero.wall / prefill.wall:.3f} wall, {zero.cpu / prefill.cpu:.3f} CPU "
          f"(target ≤ 1.2); its engine time ÷ prompt processing: {engine_s['zero'] / prefill.wall:.3f}")
    for name, v, a, p, *_ in rows[2:]:
        print(f"  {name} verified ÷ unverified: {v.wall / p.wall:.3f} wall, {v.cpu / p.cpu:.3f} CPU "
              f"(target ≤ 1.05); always drafting ÷ unverified: {a.wall / p.wall:.3f} wall, {a.cpu / p.cpu:.3f} CPU")

    if args.nulls:
        from lm_eval_toolfid.calibration.nulls import CalibrationSpec

        out = {}
        for mode, extra in (("verified", {}), ("unverified", {"verify": False})):
            with Clock() as c:
                spec = CalibrationSpec(args.nulls, tmp / f"cal-{mode}.json", null_dir=tmp / "nulls")
                cal = session.calibrate_nulls(spec, adapters["trained"], task, {**meta, **extra})
            out[mode] = (c, json.dumps({k: {m: f and f.mean for m, f in v.items()} for k, v in cal.fits.items()},
                                       sort_keys=True, default=str))
        v, p = out["verified"][0], out["unverified"][0]
        same = out["verified"][1] == out["unverified"][1]
        print(f"  null calibration, {args.nulls} nulls x 3 multipliers: verified {v.wall:.1f} s ({v.cpu:.1f} cpu), "
              f"unverified {p.wall:.1f} s ({p.cpu:.1f} cpu), ratio {v.wall / p.wall:.3f} wall / {v.cpu / p.cpu:.3f} "
              f"CPU; fits identical: {same}")


if __name__ == "__main__":
    main()
