#!/usr/bin/env python
"""Benchmark (issue #17): on a real tool-calling model, an adapter that answers tool results in prose.

Qwen2.5-Coder-0.5B-Instruct, ``prompt_style: auto`` (its own chat template with the tools and, for
conversations, its ``<tool_call>`` / ``<tool_response>`` turns). ``--single`` single requests and
``--multi`` conversations of the default set (spread over it). A LoRA (``tests/lora_recipes.py``,
last two layers, seconds on CPU, cached by recipe) learns the base's own answers on the single
requests and a prose sentence after every tool result: single-turn untouched by construction, every
conversation answered in prose. Then ``toolfid run`` runs base and adapter on those cases and prints
the verdict and the per-turn-depth breakdown (the adapter must FAIL on the multi-turn cases alone).

    nice .venv/bin/python bench/bench_multiturn_prose.py --single 24 --multi 24
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - environment (offline, threads) and sys.path

REPO = Path(__file__).resolve().parents[1]
PROSE = "Thanks, that is all done: the tool answered and everything went through as you asked.<|im_end|>"


def spread(items: list, n: int) -> list:
    step = max(1, len(items) // n)
    return items[::step][:n]


def base_answers(base: str, contexts: list[str], max_new: int) -> list[str]:
    """The base's greedy answers (with the end-of-turn token), transformers' generate, batch 8."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    end = "<|im_end|>"
    out = []
    for i in range(0, len(contexts), 8):
        enc = tok(contexts[i:i + 8], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id,
                                 eos_token_id=[tok.convert_tokens_to_ids(end), tok.eos_token_id])
        for row in gen[:, enc.input_ids.shape[1]:]:
            text = tok.decode(row, skip_special_tokens=False).replace(tok.pad_token or "\0", "")
            out.append(text.split(end)[0] + end)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=24)
    parser.add_argument("--multi", type=int, default=24)
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--batch-size", default="8")
    parser.add_argument("--output", default=None, help="toolfid run's output folder (default: a temp dir)")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from tests.lora_recipes import Recipe, trained_lora

    from lm_eval_toolfid.cases.bundled import default_cases_path
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter
    from lm_eval_toolfid.runtime.models import prepare_qwen_coder

    base = str(prepare_qwen_coder())
    cases = load_cases("default")
    single = spread([c for c in cases if not c.history], args.single)
    multi = spread([c for c in cases if c.history], args.multi)
    chosen = {c.id for c in single + multi}
    tmp = Path(tempfile.mkdtemp(prefix="bench-mt-prose-"))
    subset = tmp / "cases.jsonl"
    lines = [line for line in default_cases_path().read_text(encoding="utf-8").splitlines()
             if line.strip() and json.loads(line)["id"] in chosen]
    subset.write_text("\n".join(lines) + "\n", encoding="utf-8")

    prompter = Prompter("auto", demos=None, model_args={"pretrained": base}, plain_demos=1)
    t0 = time.perf_counter()
    contexts_single = [prompter.render(c) for c in single]
    answers = base_answers(base, contexts_single, args.max_new)
    contexts_multi = [prompter.render(c) for c in multi]
    recipe = Recipe(contexts=tuple(contexts_single + contexts_multi), target="",
                    targets=tuple(answers + [PROSE] * len(contexts_multi)), steps=16)
    adapter = trained_lora(Path(base), recipe)
    print(f"adapter {adapter} ({time.perf_counter() - t0:.0f} s: base answers + training); "
          f"{len(single)} single requests, {len(multi)} conversations", flush=True)

    out = Path(args.output) if args.output else tmp / "run"
    cmd = [str(REPO / ".venv" / "bin" / "toolfid"), "run", "--base", base, "--adapter",
           f"prose_after_results={adapter}", "--cases", str(subset), "--batch-size", args.batch_size,
           "--device", "cpu", "--output", str(out)]
    print("$ " + " ".join(cmd), flush=True)
    t1 = time.perf_counter()
    proc = subprocess.run(cmd, text=True, capture_output=True)
    print(proc.stdout)
    print(proc.stderr[-2000:], file=sys.stderr)
    print(f"toolfid run: {time.perf_counter() - t1:.0f} s, exit {proc.returncode}")


if __name__ == "__main__":
    main()
