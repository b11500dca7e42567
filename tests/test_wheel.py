"""What users install is the wheel: it must hold every subpackage and data file, and work where the checkout
is not importable (`toolfid demo`, and `lm_eval --tasks tool_use_fidelity --include_path $(toolfid tasks-path)`).
The sdist must build the same wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f]


def _wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in z.namelist() if ".dist-info/" not in n}


def _pip(*args: str, cwd: Path | None = None) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A wheel built from the tracked tree (what a fresh clone holds), and one built from its sdist."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    for name in _tracked():
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    _pip("wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(root / "dist"))
    proc = subprocess.run([sys.executable, "-c", "from setuptools import build_meta; "
                           f"print(build_meta.build_sdist({str(root / 'sdist')!r}))"],
                          cwd=src, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sdist = root / "sdist" / proc.stdout.strip().splitlines()[-1]
    _pip("wheel", "--no-deps", "--no-build-isolation", "-q", str(sdist), "-w", str(root / "from-sdist"))
    return root, next((root / "dist").glob("*.whl")), next((root / "from-sdist").glob("*.whl"))


def test_the_wheel_holds_every_tracked_file_of_the_package_and_the_task_folder(built):
    _, wheel, _ = built
    want = set()
    for name in _tracked():
        if name.startswith("lm_eval_toolfid/"):
            want.add(name)
        elif name.startswith("tasks/"):
            want.add("lm_eval_toolfid/" + name)
    have = set(_wheel_files(wheel))
    assert sorted(want - have) == [], "tracked files the wheel leaves out"
    assert sorted(have - want) == [], "files in the wheel that are not tracked"


def test_the_sdist_builds_the_same_wheel(built):
    _, wheel, from_sdist = built
    assert _wheel_files(from_sdist) == _wheel_files(wheel)


def test_the_installed_wheel_runs_the_demo_and_lm_eval_outside_the_checkout(built, tmp_path):
    _, wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (torch, lm-eval, ...) from the test environment; a path listed in a .pth file is not a
    # site directory, so the checkout's editable-install hook in there is not run: the checkout stays invisible
    (site / "toolfid_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _pip("--python", str(py), "install", "--no-deps", "-q", str(wheel))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TOOLFID_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", COLUMNS="160")
    where = subprocess.run([str(py), "-c", "import lm_eval_toolfid, json; print(lm_eval_toolfid.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    toolfid = str(venv / "bin" / "toolfid")
    demo = subprocess.run([toolfid, "demo", "--no-breakdown", "--output", str(tmp_path / "demo")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert demo.returncode == 0, demo.stderr[-3000:]
    table = demo.stdout.split("\n\n")[1].splitlines()  # the verdict table: one line per adapter
    verdicts = {line.split()[0]: line for line in table
                if line.split()[:1] and line.split()[0] in ("faithful", "hallucinating", "broken")}
    assert " PASS " in verdicts["faithful"] and " FAIL " in verdicts["hallucinating"] and " FAIL " in verdicts["broken"]
    tasks = subprocess.run([toolfid, "tasks-path"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120).stdout.strip()
    assert Path(tasks).is_relative_to(venv)
    base = json.loads(subprocess.run([toolfid, "fixtures"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                     timeout=120).stdout)["base"]
    run = subprocess.run([str(py), "-m", "lm_eval", "--tasks", "tool_use_fidelity", "--include_path", tasks,
                          "--model", "hf", "--model_args", f"pretrained={base}", "--limit", "4", "--device", "cpu",
                          "--output_path", str(tmp_path / "lm")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(next((tmp_path / "lm").rglob("results_*.json")).read_text())
    assert "json_valid_rate,none" in results["results"]["tool_use_fidelity"]
