#!/usr/bin/env python
"""Record real structured ``tool_calls`` from ``transformers serve`` (replayed by tests/test_served_faults.py).

SmolLM2-135M-Instruct never writes ``<tool_call>``, and ``transformers serve`` parses tool calls only for model
types it knows or a tokenizer that declares a ``response_template``. So: a LoRA trained (seconds on CPU, last two
layers) to answer the first cases' chat prompts with ``<tool_call>{json}</tool_call>``, merged into a copy of the
base, whose ``tokenizer_config.json`` declares the ChatML ``<tool_call>`` response template (the one transformers
ships for Qwen2). The script serves it, sends each case's chat request with its ``tools=`` (greedy, as
``toolfid run --server --api chat`` does), and writes one JSON line per case: the case id, the HTTP status, the
raw response body. Prints what came back.

Usage::

    .venv/bin/python bench/record_served_tool_calls.py [--cases 6] [--max-tokens 160]
        [--output tests/data/served_tool_calls.jsonl] [--server URL] [--merged DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from _common import real_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open_pattern": r"\s*<tool_call>", "close": "</tool_call>", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--output", default=str(ROOT / "tests" / "data" / "served_tool_calls.jsonl"))
    parser.add_argument("--server", help="a transformers serve already running (default: start one)")
    parser.add_argument("--merged", help="a merged model folder made by an earlier run")
    args = parser.parse_args()

    import torch

    from lm_eval_toolfid.cases.bundled import default_cases_path
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter
    from tests.lora_recipes import Recipe, trained_lora
    from tests.served_helpers import Server, merged_copy

    torch.set_num_threads(1)
    base = Path(real_model("smollm2"))
    cases = [c for c in load_cases(str(default_cases_path()))
             if not c.history and c.gold_tool_name and c.gold_arguments][: args.cases]
    prompter = Prompter("chat", demos=0, model_args={"pretrained": str(base)})
    if args.merged:
        merged = Path(args.merged)
    else:
        targets = tuple("<tool_call>\n" + json.dumps({"name": c.gold_tool_name, "arguments": c.gold_arguments})
                        + "\n</tool_call><|im_end|>" for c in cases)
        recipe = Recipe(contexts=tuple(prompter.render(c) for c in cases), target="", targets=targets, steps=16)
        merged = merged_copy(base, trained_lora(base, recipe), Path(tempfile.mkdtemp(prefix="tool-call-lora-")))
        config = json.loads((merged / "tokenizer_config.json").read_text())
        config["response_template"] = RESPONSE_TEMPLATE
        (merged / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    server = None
    url = args.server
    if not url:
        server = Server(Path(tempfile.mkdtemp()) / "serve.log").start()
        url = server.url
    rows = []
    try:
        for case in cases:
            body = {"model": str(merged), **prompter.chat_request(case), "temperature": 0, "top_p": 1,
                    "max_tokens": args.max_tokens}
            request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    status, raw = response.status, response.read()
            except urllib.error.HTTPError as exc:
                status, raw = exc.code, exc.read()
            text = raw.decode("utf-8", "replace")
            rows.append({"case_id": case.id, "status": status, "body": text})
            shape = "tool_calls" if '"tool_calls"' in text and status == 200 else f"HTTP {status}"
            print(f"{case.id}: {shape} {text[:160]}")
    finally:
        if server is not None:
            server.stop()
    Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {args.output} ({len(rows)} responses from transformers serve, model {merged})")


if __name__ == "__main__":
    main()
