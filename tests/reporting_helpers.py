"""Build lm-eval-shaped results + samples on disk from per-case outcomes (for the fast reporting tests).

The metrics written are computed from the cases given, the same way the task computes them, so a
test that reads them back checks the reading, not numbers typed into the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TASK = "tool_use_fidelity_fixture"


def outcome(kind: str, name: str | None = "get_weather", keyword: str | None = None, detail: str | None = None,
            surface: str | None = "bare_json", hallucinated: bool | None = None,
            arguments: dict | None = None) -> dict[str, Any]:
    return {"kind": kind, "keyword": keyword, "detail": detail, "name": name,
            "arguments": arguments if arguments is not None else ({"city": "Paris"} if kind == "valid" else None),
            "surface": surface, "n_calls": 1 if name else 0,
            "hallucinated": (hallucinated or False) if kind == "valid" else None}


def case(cid: str, tool: str, base: dict | None, ft: dict, text: str = "", prompt: str = "") -> dict[str, Any]:
    return {"id": cid, "tool": tool, "base": base, "ft": ft, "text": text or json.dumps({"name": ft.get("name")}),
            "prompt": prompt or f"request {cid}"}


def write_run(folder: Path, cases: list[dict], *, model: str = "/models/base", adapter: str | None = "/ad/a1",
              layout: str = "toolfid", case_set: str = "cs1", fingerprint: str = "fp1", date: float = 1.0,
              other_tasks: dict[str, dict[str, Any]] | None = None, verdict: dict | None = None,
              stamp: str = "2026-11-22T13-00-00.000001", model_args_as_string: bool = False,
              task: str = TASK, toolfid_task: bool = True) -> Path:
    n = len(cases)
    valid = sum(c["ft"]["kind"] == "valid" for c in cases)
    metrics: dict[str, Any] = {"json_valid_rate,none": valid / n,
                               "parse_rate,none": sum(c["ft"]["kind"] not in ("no_call", "malformed") for c in cases) / n,
                               "hallucination_rate,none": sum(bool(c["ft"].get("hallucinated")) for c in cases) / max(valid, 1)}
    paired = all(c["base"] is not None for c in cases)
    if paired:
        base_valid = sum(c["base"]["kind"] == "valid" for c in cases)
        metrics.update({"base_json_valid_rate,none": base_valid / n, "validity_delta,none": (valid - base_valid) / n,
                        "validity_delta_stderr,none": 0.05, "fidelity_pass,none": 1.0})
    results: dict[str, Any] = {"alias": task, **metrics}
    all_results = {task: results} if toolfid_task else {}
    for other, values in (other_tasks or {}).items():
        all_results[other] = {"alias": other, **values}
    model_args = {"pretrained": model, **({"peft": adapter} if adapter else {})}
    toolfid = {"case_set": case_set, "n_cases": n, "adapter": adapter,
               "run_key": {"base": {"pretrained": model, "fingerprint": fingerprint}, "case_set": case_set},
               "pairing": "base_samples (test)" if paired else "none: no base reference"}
    if verdict is not None:
        toolfid["verdict"] = verdict
    payload = {"results": all_results, "configs": {task: {"metadata": {"toolfid": toolfid}}} if toolfid_task else {},
               "config": {"model": "hf", "model_args": ",".join(f"{k}={v}" for k, v in model_args.items())
                          if model_args_as_string else model_args},
               "n-samples": {task: {"original": n, "effective": n}}, "date": date}
    samples = []
    for i, c in enumerate(cases):
        record = {"case_id": c["id"], "ft": c["ft"], "base": c["base"], "arg_disagreement": None}
        samples.append({"doc_id": i, "doc": {"id": c["id"], "prompt": c["prompt"], "gold_tool_name": c["tool"]},
                        "resps": [[c["text"]]], "filtered_resps": [c["text"]], "fidelity_pass": record,
                        "json_valid_rate": int(c["ft"]["kind"] == "valid")})
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "toolfid":
        results_file = folder / "results.json"
        samples_file = folder / "samples.jsonl"
    else:
        results_file = folder / f"results_{stamp}.json"
        samples_file = folder / f"samples_{task}_{stamp}.jsonl"
    results_file.write_text(json.dumps(payload), encoding="utf-8")
    samples_file.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    return results_file


def gate(name: str, value: float | None, passed: bool | None, op: str = ">=", threshold: float = -0.05) -> dict:
    return {"name": name, "value": value, "threshold": threshold, "op": op, "passed": passed, "note": ""}


def verdict(*gates: dict) -> dict:
    decided = [g["passed"] for g in gates]
    passed = False if False in decided else (None if None in decided else True)
    return {"passed": passed, "label": {True: "PASS", False: "FAIL", None: "UNDECIDED"}[passed],
            "gates": list(gates), "notes": ["no null calibration: z not computed"], "reason": "test"}
