"""One base is the same base in every flow: ``toolfid run``, ``toolfid calibrate``, plain ``lm_eval`` (with the
task folder given as the installed path or as the checkout's relative ``tasks``) and ``simple_evaluate``.

The README's calibration flow (``toolfid calibrate`` then ``lm_eval ... --metadata '{"calibration": ...}'``)
runs through the real CLIs; it was refused before because lm-eval's own ``config_source`` (the YAML's path)
leaked into the base identity.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from contextlib import redirect_stderr, redirect_stdout

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path

from .conftest import REPO
from .lm_eval_helpers import BIN, FIXTURE_TASK, lm_eval_here, metrics, read_run, toolfid_meta

pytestmark = pytest.mark.slow
FIX = fixture_paths()
KEY_FIELDS = ("base", "case_set", "prompt", "generation")


def _env(home):
    return dict(os.environ, TOOLFID_HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                OMP_NUM_THREADS="1")


def _toolfid(args, home):
    """``toolfid ARGS`` in this process: the flows compared here are toolfid's code paths, which a new interpreter
    would only start more slowly (the console scripts are run by tests/test_lm_eval_cli.py)."""
    from lm_eval_toolfid.cli import main

    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(io.StringIO()), redirect_stderr(err):
        for key, value in _env(home).items():
            mp.setenv(key, value)
        code = main(args)
    assert code in (0, 1, 2), err.getvalue()[-2000:]


@pytest.fixture(scope="module")
def flows(tmp_path_factory):
    """The run key of one base (the fixture) as each flow records it, and a calibration made for it."""
    root = tmp_path_factory.mktemp("flows")
    home = root / "home"
    keys = {}
    _toolfid(["run", "--base", FIX["base"], "--adapter", f"faithful={FIX['adapters']['faithful']}", "--task",
              FIXTURE_TASK, "--output", str(root / "run"), "--no-breakdown"], home)
    keys["toolfid run (base view)"] = toolfid_meta(json.loads((root / "run" / "base" / "results.json").read_text()))
    keys["toolfid run (adapter view)"] = toolfid_meta(
        json.loads((root / "run" / "faithful" / "results.json").read_text()))
    calib = root / "calib.json"
    _toolfid(["calibrate", "--base", FIX["base"], "--adapter", FIX["adapters"]["faithful"], "--runs", "1",
              "--multipliers", "1", "--task", FIXTURE_TASK, "--output", str(calib)], home)
    keys["toolfid calibrate"] = {"run_key": {k: json.loads(calib.read_text())["provenance"][k] for k in KEY_FIELDS}}
    # plain lm_eval, task folder from a checkout (relative) and from the installed package (absolute)
    proc = lm_eval_here(f"pretrained={FIX['base']}", root / "cli", home, extra=["--limit", "4"])  # in process
    assert proc.returncode == 0, proc.stderr[-2000:]
    keys["lm_eval (installed task path)"] = toolfid_meta(read_run(root / "cli")[0])
    # the checkout's relative `tasks` folder and model path, as typed in the checkout: through lm-eval's entry point
    # in this process (what is compared is the run key lm-eval's config gives the task, not the console script:
    # the README flow below runs that same relative path through the real `lm_eval` console script)
    proc = lm_eval_here(f"pretrained={os.path.relpath(FIX['base'], REPO)},dtype=float32", root / "rel", home,
                        extra=["--limit", "4"], include_path="tasks", cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    keys["lm_eval (relative task path, dtype given)"] = toolfid_meta(read_run(root / "rel")[0])
    # simple_evaluate in this process
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    os.environ["TOOLFID_HOME"] = str(home)
    out = simple_evaluate(model="hf", model_args=f"pretrained={FIX['base']}", tasks=[FIXTURE_TASK], limit=4,
                          task_manager=TaskManager(include_path=str(tasks_path()), include_defaults=False),
                          device="cpu", bootstrap_iters=0)
    keys["simple_evaluate"] = out["configs"][FIXTURE_TASK]["metadata"]["toolfid"]
    return root, home, calib, {flow: meta["run_key"] for flow, meta in keys.items()}


def test_pairing_and_calibration_keys_agree_across_flows(flows):
    _, _, _, keys = flows
    first_flow, first = next(iter(keys.items()))
    for flow, key in keys.items():
        differ = [f for f in KEY_FIELDS if key[f] != first[f]]
        assert differ == [], f"{flow} differs from {first_flow} in {differ}: {key} vs {first}"
    assert "config_source" not in first["base"] and "pretrained" not in first["base"]
    assert first["base"]["fingerprint"] and first["base"]["dtype"] == "float32"


def test_readme_calibration_flow_through_the_real_clis(flows, tmp_path):
    """``toolfid calibrate`` → ``lm_eval ... peft=A --metadata '{"calibration": FILE}'``: z is computed (it
    was refused with "calibration was made for another base model")."""
    _, home, calib, _ = flows
    # the base reference the adapter run pairs with (written by the toolfid run above, same key)
    # the installed task folder through lm-eval's entry point in this process; the checkout's `tasks` folder
    # (relative, as the README types it) through the console script
    for include in (str(tasks_path()), "tasks"):
        model_args = f"pretrained={FIX['base']},peft={FIX['adapters']['faithful']}"
        if include != "tasks":
            proc = lm_eval_here(model_args, tmp_path / include[-5:], home, metadata={"calibration": str(calib)},
                                extra=["--batch_size", "1"])
        else:
            cmd = [str(BIN / "lm_eval"), "--tasks", FIXTURE_TASK, "--include_path", include, "--model", "hf",
                   "--model_args", model_args, "--metadata", json.dumps({"calibration": str(calib)}),
                   "--output_path", str(tmp_path / include[-5:]), "--log_samples", "--device", "cpu"]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(home), cwd=REPO, timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results, _ = read_run(tmp_path / include[-5:])
        m, meta = metrics(results), toolfid_meta(results)
        assert "json_valid_z" in m and meta["null"]["k"] == 1
        assert meta["pairing"].startswith("reference store"), meta["pairing"]
