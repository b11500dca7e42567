#!/usr/bin/env python
"""Benchmark: ``toolfid run --server`` against ``transformers serve`` vs ``toolfid run`` in process, same cases.

Starts ``transformers serve`` on loopback (its own process, ``--server-threads`` torch threads; optionally with
``--continuous-batching``), serves the base and a LoRA merged into a copy of it, and times, in one run:

- ``toolfid run --server URL --base BASE --adapter MERGED`` (``--concurrency`` requests in flight),
- ``toolfid run --base BASE --adapter PEFT`` in process (toolfid's engine: batched rows, the adapter view verifies
  the base's answers).

Prints wall seconds per run, cases per second, the ratio, and whether every case scored the same (the served base
view against the in-process base view; the adapter views differ only where merged and unmerged arithmetic do).

Usage::

    .venv/bin/python bench/bench_served.py [--model smollm2] [--cases 16] [--concurrency 8]
        [--server-threads 2] [--continuous-batching]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import real_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
BIN = Path(sys.executable).parent


def _scored(folder: Path) -> dict[str, tuple]:
    out = {}
    for line in (folder / "samples.jsonl").read_text().splitlines():
        if line.strip():
            s = json.loads(line)
            ft = (s.get("fidelity_pass") or s.get("cases_scored"))["ft"]
            out[s["doc"]["id"]] = (ft["kind"], ft.get("text"))
    return out


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode not in (0, 1, 2):
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--cases", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--server-threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--continuous-batching", action="store_true")
    args = parser.parse_args()

    from lora_recipes import zero_lora
    from served_helpers import Server, merged_copy

    base = Path(real_model(args.model))
    root = Path(tempfile.mkdtemp(prefix="bench-served-"))
    adapter = zero_lora(base, root / "zero")
    merged = merged_copy(base, adapter, root / "merged")
    env = dict(os.environ, TOOLFID_HOME=str(root / "home"), HF_HUB_OFFLINE="1")
    server = Server(root / "serve.log", threads=args.server_threads,
                    extra=["--continuous-batching"] if args.continuous_batching else [])
    server.start()
    try:
        served = _timed([str(BIN / "toolfid"), "run", "--server", server.url, "--base", str(base), "--adapter",
                         f"zero={merged}", "--limit", str(args.cases), "--concurrency", str(args.concurrency),
                         "--output", str(root / "served"), "--json"], env)
    finally:
        server.stop()
    inproc = _timed([str(BIN / "toolfid"), "run", "--base", str(base), "--adapter", f"zero={adapter}", "--limit",
                     str(args.cases), "--device", "cpu", "--output", str(root / "inproc"), "--json"], env)
    same_base = _scored(root / "served" / "base") == _scored(root / "inproc" / "base")
    same_zero = _scored(root / "served" / "zero") == _scored(root / "inproc" / "zero")
    mode = "continuous batching" if args.continuous_batching else "one request at a time"
    print(f"model {args.model}, {args.cases} default cases x 2 views (base + B=0 LoRA), "
          f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS')}, server threads {args.server_threads}, {mode}")
    print(f"{'flow':<44} {'wall s':>8} {'cases/s':>8}")
    for name, secs in [(f"toolfid run --server (concurrency {args.concurrency})", served),
                       ("toolfid run in process (engine, verify)", inproc)]:
        print(f"{name:<44} {secs:8.1f} {2 * args.cases / secs:8.2f}")
    print(f"served / in-process wall: {served / inproc:.2f}x")
    print(f"per-case scored answers equal: base {same_base}, B=0 adapter {same_zero}")


if __name__ == "__main__":
    main()
