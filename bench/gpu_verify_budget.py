#!/usr/bin/env python
"""Benchmark (GPU): a verified view's forward passes and wall time by its pass budgets.

On a GPU a forward pass costs its kernel launches more than its arithmetic, so a verified adapter view
is as fast as the number of passes it needs. This times, on Qwen2-0.5B's architecture with random
weights (``bench/gpu.py``'s model and prompt lengths: 268 rows, drafts of 96 tokens), the plain view and
the verified view (each row's draft = the plain view's tokens) at several ``(prefill_tokens,
verify_logits)`` budgets, twice each (the first use of new shapes costs seconds: cuDNN attention builds a
plan per shape), in float32 (every draft token accepted) and bfloat16 (random weights in bfloat16 tie
everywhere: most drafts are rejected early, the worst case for verification). Prints forward passes,
seconds, and rows that differ from the first plain run.

    python bench/gpu_verify_budget.py          # on the GPU machine (../shared/gpu.md: how to carry the project)
"""

from __future__ import annotations

import random
import time
from typing import Any

import _common  # noqa: F401 - environment and sys.path
import gpu


def view(model: Any, spec: list, drafts: list | None, prefill: int, logits: int, device: Any) -> tuple:
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row

    rows = [Row(prompt=p, stopper=make(), max_new=make().max_new, draft=drafts[i] if drafts else ())
            for i, (p, make) in enumerate(spec)]
    engine = GreedyEngine(model, 151643, EngineConfig(max_batch=len(rows), prefill_tokens=prefill,
                                                      verify_logits=logits, share_prefixes=False))
    gpu.sync(device)
    t0 = time.perf_counter()
    results = engine.run(rows)
    gpu.sync(device)
    return time.perf_counter() - t0, results, engine.stats.forward_passes


def main() -> None:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(gpu.device_name(device))
    for dtype in (torch.float32, torch.bfloat16):
        model = gpu.qwen_random(dtype, device)
        rng = random.Random(1)
        spec = [([rng.randrange(1000, 150000) for _ in range(n)], lambda: gpu._NoStop(96))
                for n in gpu.prompt_lengths(268, 1.0)]
        view(model, spec, None, 16384, 64 << 20, device)  # warm-up
        _, ref, _ = view(model, spec, None, 16384, 64 << 20, device)
        drafts = [r.tokens for r in ref]
        for prefill, logits in ((16384, 64 << 20), (16384, 1 << 30), (65536, 1 << 30)):
            for rep in range(2):
                wp, plain, fp = view(model, spec, None, prefill, logits, device)
                wv, ver, fv = view(model, spec, drafts, prefill, logits, device)
                accepted = sum(r.accepted for r in ver) / sum(map(len, drafts))
                print(f"{str(dtype).removeprefix('torch.')} prefill {prefill} verify_logits {logits >> 20}M "
                      f"rep {rep}: plain {wp:.2f} s ({fp} passes, differ {gpu.differing(ref, plain)}), verified "
                      f"{wv:.2f} s ({fv} passes, differ {gpu.differing(ref, ver)}, accepted {accepted:.3f})", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
