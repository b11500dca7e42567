#!/usr/bin/env python
"""summary.json of bench/device_issue55.sh: issue 55's figures gathered from its steps (standard library only).

    python bench/device_summary.py WORK OUT --device cuda --cases 382 --adapters 10 --eager-cases 382 --seconds S

WORK holds the steps' records (``steps.tsv``: name, status, rc, seconds, cap, why) and the benches' ``--json-out``
files; OUT gets ``summary.json``. Its fields (null where the step that measures it did not finish):

- ``steps``: each step's status (ok, failed, timeout, skipped), exit code, seconds and cap, in the order run;
- ``base_view``: ``eager`` and ``replayed`` (bench/gpu_base_pace.py without and with ``--cuda-graphs``): cold and
  warm seconds of the whole view, decode steps, steps replayed and launched op by op, host ms per step, captures,
  capture seconds and graph memory (MiB) of the warm run, and the device span of the eager decode forwards;
  ``tokens_identical`` (replayed rows equal to eager rows, "same/rows"), ``warm_speedup`` (eager warm / replayed
  warm) and ``target_3s_met`` (replayed warm <= 3 s);
- ``joint``: ``replayed`` and ``eager`` (bench/bench_joint_views.py ``--modes together``): the base view alone cold
  and warm, base + N views together, ``ratio`` = together / warm base (target <= 2 replayed), the together run's
  captured steps; a run stopped by its cap says so in ``unfinished``, and if that was in the together phase,
  ``together_s`` and ``ratio`` are lower bounds ("> 200");
- ``b0``: B = 0 answers equal to the base's under CUDA graphs, "equal/cases", and the run that counted them;
- ``pytest``: counts and every test's outcome of tests/test_step_graphs.py (``gpu_test``: the replay == eager test);
- ``environment``: interpreter and library versions, the GPU; ``rehearsal``: true on a CPU (no capture, no replay).
"""

from __future__ import annotations

import argparse
import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(work: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    lines = (work / "steps.tsv").read_text().splitlines() if (work / "steps.tsv").is_file() else []
    for line in lines:
        name, status, rc, seconds, cap, why, end = (line.split("\t") + [""] * 7)[:7]
        out[name] = {"status": status, "rc": int(rc or 0), "seconds": int(seconds or 0), "cap_s": int(cap or 0),
                     **({"why": why} if why else {}), **({"end_epoch": int(end)} if end else {})}
    return out


def pace(data: Any) -> dict[str, Any] | None:
    """One gpu_base_pace.py --json-out file as the summary's view figures."""
    if not data or not data.get("runs"):
        return None
    runs = data["runs"]
    warm = runs[-1] if len(runs) > 1 else None
    last = runs[-1]
    keys = ("decode_steps", "steps_replayed", "steps_launched", "host_ms_per_step", "forward_ms_per_step",
            "captures", "capture_s", "graph_mib", "device_span_s", "tokens")
    return {"cold_s": runs[0]["wall_s"], "warm_s": warm["wall_s"] if warm else None,
            "cold_captures": runs[0].get("captures"), "cold_capture_s": runs[0].get("capture_s"),
            **{k: last.get(k) for k in keys}, "runs": len(runs)}


def joint(data: Any, step: dict[str, Any] | None) -> dict[str, Any] | None:
    if not data:
        return None if not step else {"unfinished": f"{step['status']} after {step['seconds']} s, nothing measured"}
    out = {"cases": data.get("cases"), "adapters": data.get("adapters"), "base_cold_s": data.get("base_cold_s"),
           "base_s": data.get("base_s"), "together_s": data.get("together_s"), "ratio": data.get("ratio"),
           "step_graphs": data.get("together_step_graphs"), "zero_differ": data.get("zero_differ"),
           "base_alone_together_differ": data.get("base_alone_together_differ")}
    running = data.get("running")
    if out["together_s"] is None and step:
        out["unfinished"] = f"{step['status']} after {step['seconds']} s"
        if running and step.get("end_epoch"):
            ran = step["end_epoch"] - running["since_epoch"]
            out["unfinished"] += f", in its phase '{running['phase']}' for {ran:.0f} s"
            if running["phase"] == "together":  # not finished in that time: a lower bound
                out["together_s"] = f"> {ran:.0f}"
                if out["base_s"]:
                    out["ratio"] = f"> {ran / out['base_s']:.1f}"
    return out


def pytest_result(path: Path, step: dict[str, Any] | None) -> dict[str, Any] | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None if not step else {"status": step["status"], "rc": step["rc"], "tests": {}}
    tests: dict[str, str] = {}
    for case in root.iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        tests[case.get("name", "?")] = {"failure": "failed", "error": "error"}.get(kind, kind)
    count = {k: sum(1 for v in tests.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
    gpu = {n: v for n, v in tests.items() if "on_a_gpu" in n}
    return {**count, "rc": step["rc"] if step else None, "gpu_test": gpu, "tests": tests}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", type=int)
    ap.add_argument("--adapters", type=int)
    ap.add_argument("--eager-cases", type=int)
    ap.add_argument("--seconds", type=int)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    work = args.work
    done = steps(work)
    eager, replayed = pace(read(work / "pace_eager.json")), pace(read(work / "pace_graphs.json"))
    graphs_json = read(work / "pace_graphs.json") or {}
    same = graphs_json.get("tokens_identical")
    base: dict[str, Any] = {"eager": eager, "replayed": replayed,
                            "tokens_identical": f"{same['same']}/{same['ref_rows']}" if same else None}
    if eager and replayed and eager["warm_s"] and replayed["warm_s"]:
        base["warm_speedup"] = round(eager["warm_s"] / replayed["warm_s"], 2)
        base["target_3s_met"] = replayed["warm_s"] <= 3.0
    jg = joint(read(work / "joint_graphs.json"), done.get("joint_graphs"))
    je = joint(read(work / "joint_eager.json"), done.get("joint_eager"))
    b0 = None
    for name, data in (("joint_graphs", read(work / "joint_graphs.json")), ("b0", read(work / "b0.json"))):
        if data and data.get("zero_differ") is not None:
            b0 = {"equal": f"{data['zero_cases'] - data['zero_differ']}/{data['zero_cases']}", "from": name}
            break
    rehearsal = args.device != "cuda"
    summary = {
        "issue": 55, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": args.commit,
        "device": args.device, "rehearsal": rehearsal, "seconds": args.seconds,
        **({"note": "a CPU rehearsal: --cuda-graphs ran eagerly at the captured steps' shapes (no capture, no "
                    "replay); these are no GPU figures"} if rehearsal else {}),
        "cases": args.cases, "adapters": args.adapters, "eager_joint_cases": args.eager_cases,
        "environment": read(work / "environment.json"), "steps": done, "base_view": base,
        "joint": {"replayed": jg, "eager": je, "target_ratio": 2.0}, "b0": b0,
        "pytest": pytest_result(args.out / "pytest.xml", done.get("pytest")),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
