#!/usr/bin/env python
"""Benchmark: a whole view's generation on this device, default batch vs batch 16 (issue #20).

Two models, no download:

- **Qwen2-0.5B architecture with random weights** (``bench/qwen2_0_5b_config.json``, the numbers of
  Qwen2.5-Coder-0.5B-Instruct's config), prompts of the default set's token lengths (mean ~680,
  scaled by ``--prompt-scale``), fixed-length generation (no EOS, no stop string: every row makes
  exactly ``--new-tokens``);
- **the bundled fixture model** on its own cases (real prompts, real stops).

Each is generated three ways: toolfid's engine at the default batch (``auto``: sized from free
memory; CUDA: usually the whole view at once), the engine at batch 16, and transformers'
``generate`` at batch 16 in lm-eval's order (the path before the engine). Prints wall time and
generated tokens/s and writes the table into docs/performance.md (between the ``gpu-bench``
markers) with the device's name. On CPU use small sizes:

    nice .venv/bin/python bench/gpu.py --rows 32 --new-tokens 16 --prompt-scale 0.25     # CPU
    python bench/gpu.py --dtype bfloat16                                                   # one GPU
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - environment (offline, threads) and sys.path

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "performance.md"
START, END = "<!-- gpu-bench:start -->", "<!-- gpu-bench:end -->"
# token lengths of the default set's chat prompts under Qwen's template: mean ~680, 300..1480
LENGTH_RANGE = (300, 1480)
LENGTH_MEAN = 682


def prompt_lengths(n: int, scale: float, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    lo, hi = LENGTH_RANGE
    out = []
    for _ in range(n):  # a skewed spread with about the default set's mean
        x = rng.betavariate(2, 4)
        out.append(max(8, int((lo + x * (hi - lo)) * scale)))
    return out


def device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} torch threads)"


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _NoStop:
    """Fixed-length generation: only the budget stops a row."""

    def __init__(self, max_new: int) -> None:
        self.max_new, self.count = max_new, 0

    def push(self, token: int) -> str | None:
        self.count += 1
        return "length" if self.count >= self.max_new else None


def run_engine(model: Any, rows_spec: list[tuple[list[int], Any]], batch: int | str, pad_id: int,
               device: Any, share_prefixes: bool = True, drafts: list[list[int]] | None = None,
               record_gaps: bool = False) -> tuple[float, int, int, list[Any]]:
    """One view through the engine: wall, tokens generated, the batch it ran, each row's result (with
    ``drafts``: a verified view, each row's draft the given tokens)."""
    from lm_eval_toolfid.integrations.lm_eval.batch_size import auto_batch_size, halve_on_oom, verify_logits_for
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row

    def rows() -> list[Row]:
        return [Row(prompt=p, stopper=make(), max_new=make().max_new, draft=drafts[i] if drafts else ())
                for i, (p, make) in enumerate(rows_spec)]

    size = batch if isinstance(batch, int) else auto_batch_size(
        model, device, [len(p) + make().max_new for p, make in rows_spec])
    sync(device)
    t0 = time.perf_counter()
    results, used, _ = halve_on_oom(lambda b, pt: GreedyEngine(model, pad_id, EngineConfig(
        max_batch=b, prefill_tokens=pt, verify_logits=verify_logits_for(device, pt), share_prefixes=share_prefixes,
        record_gaps=record_gaps)).run(rows()),
        size, device)
    sync(device)
    return time.perf_counter() - t0, sum(len(r.tokens) for r in results), min(used, len(rows_spec)), results


def differing(a: list[Any], b: list[Any]) -> int:
    """Rows whose tokens differ between two runs of the same view."""
    return sum(x.tokens != y.tokens for x, y in zip(a, b))


def exactness(model: Any, spec: list[tuple[list[int], Any]], pad_id: int, device: Any) -> list[str]:
    """Each schedule of one view against the plain one (batch auto, prefixes computed whole): rows whose
    tokens differ, and at each one's first difference the top-two logit gap in both runs (a difference is
    rounding only where that gap is small), with the near ties the engine counted (``near_tie``)."""
    from lm_eval_toolfid.engine.decoding import near_tie_for

    bound = near_tie_for(next(model.parameters()).dtype)
    _, _, _, ref = run_engine(model, spec, "auto", pad_id, device, share_prefixes=False, record_gaps=True)
    out = []
    for how, kw in (("prefixes shared", dict(share_prefixes=True)),
                    ("batch 16, prefixes computed whole", dict(batch=16, share_prefixes=False)),
                    ("batch 16, prefixes shared", dict(batch=16, share_prefixes=True)),
                    ("verified (draft = plain tokens), prefixes computed whole",
                     dict(share_prefixes=False, drafts=[r.tokens for r in ref])),
                    ("verified (draft = plain tokens), prefixes shared",
                     dict(share_prefixes=True, drafts=[r.tokens for r in ref]))):
        batch = kw.pop("batch", "auto")
        wall, _, _, res = run_engine(model, spec, batch, pad_id, device, record_gaps=True, **kw)
        gaps, silent = [], 0
        for a, b in zip(ref, res):
            if a.tokens != b.tokens:
                i = next((j for j, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                         min(len(a.tokens), len(b.tokens)))
                if i < min(len(a.gaps), len(b.gaps)):
                    gaps.append(max(a.gaps[i], b.gaps[i]))
                silent += not (b.near_ties + b.shared_near_ties)
        ties = sum(r.near_ties + r.shared_near_ties for r in res)
        n_diff = differing(ref, res)
        out.append(f"{how} ({wall:.2f} s): rows differing {n_diff}/{len(res)}"
                   + (f", top-two gap at the first difference <= {max(gaps):.3g} (median {sorted(gaps)[len(gaps) // 2]:.3g})"
                      if gaps else "") + f", {silent} of them without a counted near tie"
                   + f"; near ties counted (gap < {bound:g}): {ties}")
        print("  " + out[-1], flush=True)
    return out


def run_generate(model: Any, rows_spec: list[tuple[list[int], Any]], batch: int, pad_id: int, stop: Any,
                 device: Any) -> tuple[float, int]:
    """transformers' generate, longest first, left-padded batches (lm-eval's order)."""
    import torch

    order = sorted(range(len(rows_spec)), key=lambda i: -len(rows_spec[i][0]))
    sync(device)
    t0 = time.perf_counter()
    tokens = 0
    for b in range(0, len(order), batch):
        chunk = [rows_spec[i] for i in order[b:b + batch]]
        L = max(len(p) for p, _ in chunk)
        ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (p, _) in enumerate(chunk):
            ids[r, L - len(p):] = torch.tensor(p)
            mask[r, L - len(p):] = 1
        max_new = max(make().max_new for _, make in chunk)
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                                 do_sample=False, pad_token_id=pad_id, **stop(chunk))
        new = out[:, L:]
        tokens += int((new != pad_id).sum()) if stop(chunk) else new.numel()
    sync(device)
    return time.perf_counter() - t0, tokens


def qwen_random(dtype: Any, device: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads((HERE / "qwen2_0_5b_config.json").read_text()))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=268, help="rows of the random-weight view (default: 268)")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--prompt-scale", type=float, default=1.0, help="scale the default set's prompt lengths")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--skip-generate", action="store_true", help="leave out transformers' generate")
    parser.add_argument("--skip-batch16", action="store_true", help="leave out the engine at batch 16")
    parser.add_argument("--exactness", nargs="*", default=["float32", "bfloat16"], metavar="DTYPE",
                        help="dtypes to compare the fixture model's schedules in (default: float32 bfloat16)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each prefix-sharing setting (default: 2)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not touch docs/performance.md")
    args = parser.parse_args()
    _common.threads()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import render_prompt
    from lm_eval_toolfid.prompts.settings import PromptSettings
    from lm_eval_toolfid.integrations.lm_eval.stopping import eos_token_ids
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper, make_stopping_criteria

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    name = device_name(device)
    table = []

    # --- Qwen2-0.5B architecture, random weights, fixed-length generation ----------------------
    model = qwen_random(dtype, device)
    rng = random.Random(1)
    lengths = prompt_lengths(args.rows, args.prompt_scale)
    spec = [([rng.randrange(1000, 150000) for _ in range(n)], lambda: _NoStop(args.new_tokens)) for n in lengths]
    label = f"Qwen2-0.5B arch, random weights, {args.rows} rows x {args.new_tokens} new tokens, " \
            f"prompts mean {sum(lengths) / len(lengths):.0f} tok, {str(dtype).removeprefix('torch.')}"

    def show(how: str, wall: float, toks: int, note: str = "") -> None:
        print(f"{how:70s} {wall:8.2f} s  {toks / wall:8.1f} tok/s  {note}", flush=True)

    run_engine(model, spec[:8], "auto", 151643, device)  # warm-up (kernels, allocator): not timed
    for batch in ("auto",) + (() if args.skip_batch16 else (16,)):
        wall, toks, used, _ = run_engine(model, spec, batch, 151643, device, share_prefixes=False)
        table.append((label, f"engine, batch {batch} (ran {used})", wall, toks, ""))
        show(table[-1][1], wall, toks)
    # the same lengths, prompts sharing prefixes as the default set's chat prompts do (cases offering the same
    # tools): groups of 4 rows share their first 55% of tokens (the default set's chat prompts: 0.550 to compute)
    shared = []
    for g in range(0, len(spec), 4):
        group = spec[g:g + 4]
        head = group[0][0][:int(0.55 * min(len(p) for p, _ in group))]
        shared += [(head + p[len(head):], make) for p, make in group]
    slabel = label + ", prompts sharing prefixes in groups of 4"
    outputs: dict[bool, list[list[int]]] = {}
    for rep in range(args.repeat):  # timings on a GPU vary between identical runs: each setting twice
        for share in (False, True):
            wall, toks, used, out = run_engine(model, shared, "auto", 151643, device, share_prefixes=share)
            note = ""
            if share in outputs or not share:
                outputs.setdefault(share, out)
            if share and False in outputs:
                note = f"rows differing from prefixes computed whole: {differing(outputs[False], out)}/{len(out)}"
            table.append((slabel, f"engine, batch auto (ran {used}), prefixes {'shared' if share else 'computed whole'}"
                          f" (run {rep + 1})", wall, toks, note))
            show(table[-1][1], wall, toks, note)
    # a verified view (what an adapter view costs when its answers follow the base's): the same model, each row's
    # draft the base view's tokens; every draft token is checked, nothing generated step by step if all agree
    for share in (False, True):
        wall, toks, used, out = run_engine(model, shared, "auto", 151643, device, share_prefixes=share,
                                           drafts=[r.tokens for r in outputs[False]])
        note = f"rows differing from the plain view: {differing(outputs[False], out)}/{len(out)}"
        table.append((slabel, f"engine, verified view (draft = the plain view's tokens), prefixes "
                      f"{'shared' if share else 'computed whole'}", wall, toks, note))
        show(table[-1][1], wall, toks, note)
    table.append((label, "compiled decode step", None, None, ""))
    if not args.skip_generate:
        wall, toks = run_generate(model, spec, 16, 151643, lambda chunk: {}, device)
        table.append((label, "transformers generate, batch 16", wall, toks, ""))
        show(table[-1][1], wall, toks)
    del model

    # --- the fixture model on its cases (real prompts, real stops) ---------------------------
    paths = fixture_paths()
    tok = AutoTokenizer.from_pretrained(paths["base"])
    fx = AutoModelForCausalLM.from_pretrained(paths["base"], dtype=dtype).to(device).eval()
    eos = eos_token_ids(fx, tok)
    cases = load_cases("fixture")
    prompts = [tok(render_prompt(c, PromptSettings(demos=0)))["input_ids"] for c in cases]
    spec = [(p, lambda: RowStopper(tok, eos, ["\n###"], 128, call_end=True)) for p in prompts]

    def stop(chunk: list) -> dict:
        L = max(len(p) for p, _ in chunk)
        return {"stopping_criteria": StoppingCriteriaList([make_stopping_criteria(tok, L, len(chunk), ["\n###"])])}

    label = f"fixture model, {len(cases)} cases, stop at the end of the call"
    first = None
    run_engine(fx, spec[:8], "auto", tok.pad_token_id, device)  # warm-up: not timed
    for batch, share in (("auto", False), ("auto", True), (16, True)):
        wall, toks, used, out = run_engine(fx, spec, batch, tok.pad_token_id, device, share_prefixes=share)
        first = first or out
        note = f"rows differing from the first: {differing(first, out)}/{len(out)}" if out is not first else ""
        table.append((label, f"engine, batch {batch} (ran {used}), prefixes {'shared' if share else 'computed whole'}",
                      wall, toks, note))
        show(table[-1][1], wall, toks, note)
    if not args.skip_generate:
        wall, toks = run_generate(fx, spec, 16, tok.pad_token_id, stop, device)
        table.append((label, "transformers generate, batch 16", wall, toks, ""))
        show(table[-1][1], wall, toks)

    checks = []
    for name_ in args.exactness:  # every schedule of a view against the plain one, per dtype
        dt = getattr(torch, name_)
        print(f"exactness, fixture model, {name_}:", flush=True)
        m = fx if dt == dtype else AutoModelForCausalLM.from_pretrained(paths["base"], dtype=dt).to(device).eval()
        checks += [f"- fixture model, {len(cases)} cases, {name_}, " + line for line in exactness(m, spec, tok.pad_token_id, device)]

    lines = [f"Device: **{name}**, torch {torch.__version__} (`bench/gpu.py "
             f"--rows {args.rows} --new-tokens {args.new_tokens} --prompt-scale {args.prompt_scale}`)", "",
             "| model / view | generation | wall | generated tok/s | outputs |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {how} | {wall:.2f} s | {toks / wall:,.0f} | {note or '—'} |" if wall is not None else
              f"| {m} | {how} | not measured: no compiled step ships (on CPU, `torch.compile` of the decode step "
              "compiled for 150 s, then ran 5x slower than eager and gave other logits; docs/performance.md) | — | — |"
              for m, how, wall, toks, note in table]
    if checks:
        lines += ["", "Outputs against the plain schedule (batch auto, prefixes computed whole), same model, same dtype:",
                  ""] + checks
    text = "\n".join(lines)
    print("\n" + text)
    if not args.no_write and DOC.is_file():
        doc = DOC.read_text(encoding="utf-8")
        if START in doc and END in doc:
            head, rest = doc.split(START, 1)
            _, tail = rest.split(END, 1)
            DOC.write_text(f"{head}{START}\n{text}\n{END}{tail}", encoding="utf-8")
            print(f"\nwrote the table into {DOC}")


if __name__ == "__main__":
    main()
