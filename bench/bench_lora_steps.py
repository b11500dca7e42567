#!/usr/bin/env python
"""Benchmark: what one decode step costs the host as adapters join the batch — aten calls and host ms per step for the
base alone and base + 1, 2, 4, 10 adapter views decoded together, with PEFT's mixed batch (one LoRA computation per
adapter per layer) and with the engine's stacked LoRA computation (one per layer for every adapter).

On a GPU a decode step is launch-bound: its cost is its calls. On the CPU the calls and the host ms per step stand in
for it. The default model is a tiny-width stand-in of SmolLM2-135M's depth (its ``LlamaForCausalLM`` config, 30
layers, hidden size 24, random weights; r = 8 LoRAs on q, k, v, o, gate, up and down made with PEFT, random B): what a
step costs beyond its arithmetic. ``--model smollm2`` runs the real model (random LoRAs on it).

    OMP_NUM_THREADS=1 nice .venv/bin/python bench/bench_lora_steps.py
    python bench/bench_lora_steps.py --model smollm2 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json

from _common import print_step_costs, real_model, step_costs, threads

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(model_name: str, adapters: int, device: str, dtype: str, width: int) -> tuple[object, list[str]]:
    """The base (a tiny-width stand-in of SmolLM2's depth, or a real model) with ``adapters`` random r = 8 LoRAs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = real_model("smollm2" if model_name == "stand-in" else model_name)
    if model_name == "stand-in":
        config = LlamaConfig.from_pretrained(path)
        config.hidden_size, config.intermediate_size, config.vocab_size = width, 2 * width, 256
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = 3, 1, width // 3
        base = LlamaForCausalLM(config)
    else:
        base = AutoModelForCausalLM.from_pretrained(path)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS)
    names = [f"a{k}" for k in range(adapters)]
    model = get_peft_model(base, lora, adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, lora)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_B" in pname:
                p.normal_(0, 1e-3)
    return model.to(device=device, dtype=getattr(torch, dtype)).eval(), names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="stand-in", help="stand-in (default: tiny width, SmolLM2's depth), smollm2, "
                                                        "or a model folder")
    ap.add_argument("--width", type=int, default=24, help="the stand-in's hidden size (default 24)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=2, help="rows per view (default 2)")
    args = ap.parse_args()
    n_threads = threads()
    model, names = peft_model(args.model, 10, args.device, args.dtype, args.width)
    print(f"{args.model} on {args.device} ({n_threads} threads), {args.dtype}, {args.prompts} rows per view; "
          "one decode step:")
    out = {}
    for label, stack in (("PEFT", False), ("stacked", True)):
        costs = step_costs(model, names, prompts=args.prompts, stack=stack)
        print_step_costs(costs, label)
        out[label] = {n: {"calls": c, "ms": round(ms, 2)} for n, (c, ms) in costs.items()}
    print(json.dumps({"model": args.model, "device": args.device, "dtype": args.dtype, **out}))


if __name__ == "__main__":
    main()
