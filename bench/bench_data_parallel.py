#!/usr/bin/env python
"""Benchmark: ``toolfid run`` with N ranks under the real ``torchrun`` against one process, in one run.

The same command (base + one B = 0 adapter, the first ``--limit`` default cases) twice: one process with all the
machine's threads, then ``torchrun --nproc-per-node N`` with the threads split between the ranks. Prints each wall
time, the speed-up, whether the two runs' samples files are byte-identical (they must be), and the shards' balance:
each rank's share of the cases and of their rendered prompts' characters (dealt by prompt length; round
robin's balance beside it).

    OMP_NUM_THREADS=2 nice .venv/bin/python bench/bench_data_parallel.py --limit 24              # CPU, SmolLM2, 2 ranks
    python bench/bench_data_parallel.py --ranks 8 --device cuda --dtype bfloat16 --limit 382      # one 8-GPU node

On 2 CPU cores two ranks share the same cores (one thread each): expect no speed-up here; the figure that matters is
a node with one GPU per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import real_model, subset_file, threads

BIN = Path(sys.executable).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--limit", type=int, default=24, help="first N default cases (default 24)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    base = real_model(args.model)
    root = Path(tempfile.mkdtemp(prefix="bench-dp-"))
    from bench_joint_views import make_adapters

    adapters = make_adapters(base, 1, root / "adapters", zero=True)
    cases = subset_file(args.limit, root / "cases.jsonl")
    n_threads = threads()

    def run(label: str, launcher: list[str], per_rank_threads: int) -> float:
        env = dict(os.environ, TOOLFID_HOME=str(root / f"home-{label}"), HF_HUB_OFFLINE="1",
                   OMP_NUM_THREADS=str(per_rank_threads), TOKENIZERS_PARALLELISM="false")
        cmd = [*launcher, str(BIN / "toolfid"), "run", "--base", base, "--adapter", f"zero={adapters['zero']}",
               "--cases", str(cases), "--device", args.device, "--dtype", args.dtype, "--output",
               str(root / label), "--json"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"{label}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        print(f"{label}: {wall:.1f} s", flush=True)
        return wall

    one = run("one", [], n_threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [str(BIN / "torchrun"), "--nnodes", "1", "--nproc-per-node", str(args.ranks), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--no-python"]
    many = run(f"ranks{args.ranks}", launcher, max(1, n_threads // args.ranks))
    same = all((root / "one" / v / "samples.jsonl").read_bytes() ==
               (root / f"ranks{args.ranks}" / v / "samples.jsonl").read_bytes() for v in ("base", "zero"))
    from lm_eval_toolfid.integrations.lm_eval.data_parallel import deal

    sent = [json.loads(line) for line in (root / "one" / "base" / "samples.jsonl").read_text().splitlines()]
    prompts = [len(r["arguments"]["gen_args_0"]["arg_0"]) for r in sent]  # the rendered prompts the ranks sent
    shares = [[prompts[i] for i in deal(prompts, r, args.ranks)] for r in range(args.ranks)]
    robin = [prompts[r::args.ranks] for r in range(args.ranks)]
    balance = (", ".join(f"rank {r}: {len(s)} cases, {sum(s)} prompt chars" for r, s in enumerate(shares))
               + f" (longest ÷ shortest share {max(map(sum, shares)) / max(1, min(map(sum, shares))):.3f}; round robin "
               f"would give {max(map(sum, robin)) / max(1, min(map(sum, robin))):.3f})")
    print(f"\n{args.model} on {args.device}, {args.dtype}, {len(prompts)} cases, base + 1 B = 0 adapter: one process "
          f"({n_threads} threads) {one:.1f} s, {args.ranks} ranks ({max(1, n_threads // args.ranks)} thread(s) each) "
          f"{many:.1f} s: speed-up {one / many:.2f}x; samples files identical: {same}\nshards: {balance}")
    print(json.dumps({"one_s": round(one, 2), "ranks": args.ranks, "ranks_s": round(many, 2),
                      "speedup": round(one / many, 3), "identical": same, "shares": [len(s) for s in shares],
                      "prompt_chars": [sum(s) for s in shares]}))


if __name__ == "__main__":
    main()
