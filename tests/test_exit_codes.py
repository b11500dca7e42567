"""The documented exit-code table of ``toolfid``, walked end to end: the table in README.md ("## Exit codes"), the
same table in docs/reporting.md, the codes ``toolfid --help`` prints and the ``EXIT_*`` constants of
:mod:`lm_eval_toolfid.core.errors` are one set, and every code in it is reached by a real input through the real
CLI entry point (in process, or the console script where the process itself matters: 141), on the bundled fixture
model, a fake OpenAI-compatible server (tests/fake_server.py) for 6 and 7, and a monkeypatched run path for the
codes only a bug or a key press gives (3: a wrong stop rule, 5: a plain ``RuntimeError``, 130: Ctrl-C). Each walk
asserts what the table says goes with its code (one-line errors without a traceback, finished views kept for
``--resume``, nothing printed after the reader left), and a last test fails when the table gains a row no walk
reaches.
"""

from __future__ import annotations

import functools
import io
import json
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.core import errors

from .fake_server import Fake, serve
from .lm_eval_helpers import FIXTURE_TASK, toolfid_here

ROOT = Path(__file__).resolve().parents[1]
FIX = fixture_paths()
TOOLFID = str(Path(sys.executable).parent / "toolfid")
HEADER = "| Exit code | Meaning |"
KEY = "sk-exit-codes-3b9e1f"
TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]}}]
CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
N = 12
"""Cases of the shared fixture run (``--limit``): too few for non-inferiority to be shown, enough for the broken
adapter's failure to be statistically clear."""
NONINFERIORITY = json.dumps({"gate_mode": "noninferiority"})
"""The verdict rule of the shared run: the faithful adapter, equal to the base on every case, is UNDECIDED on 12
cases (the 95% CI's lower bound is far below the floor: "more cases would narrow it"); the broken one FAILs."""


# --- the table, as each place shows it -------------------------------------------------------------------------

def _table_lines(path: Path) -> list[str]:
    """The lines of the exit-code table in ``path`` (its header row to the last row)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines.count(HEADER) == 1, f"{path.name}: {lines.count(HEADER)} exit-code tables"
    start = lines.index(HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def _table(path: Path) -> dict[int, str]:
    """``code → meaning`` of the exit-code table in ``path``."""
    rows = _table_lines(path)
    assert rows[1] == "| --- | --- |", rows[:2]
    table: dict[int, str] = {}
    for row in rows[2:]:
        match = re.fullmatch(r"\| (\d+) \| (.+) \|", row)
        assert match, f"{path.name}: not a table row: {row!r}"
        code = int(match.group(1))
        assert code not in table, f"{path.name}: exit code {code} has two rows"
        table[code] = match.group(2)
    return table


def _readme_section() -> list[str]:
    """README.md's "## Exit codes" section."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## Exit codes")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


TABLE = _table(ROOT / "README.md")
TABLE_CODES = set(TABLE)


def _console(args: list[Any], home: Path) -> subprocess.CompletedProcess:
    """``toolfid ARGS`` in this process as the console script (``sys.exit(main())``) ends: also where argparse
    exits before the guard (``--help``, a bad option), which :func:`toolfid_here` would raise as ``SystemExit``."""
    from lm_eval_toolfid.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(out), redirect_stderr(err):
        mp.setenv("TOOLFID_HOME", str(home))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(sys, "argv", ["toolfid", *argv])
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
    return subprocess.CompletedProcess(["toolfid", *argv], code, out.getvalue(), err.getvalue())


def test_the_table_is_one_set_in_the_readme_the_docs_the_help_and_the_constants(tmp_path: Path) -> None:
    assert any(line.strip() == HEADER for line in _readme_section()), "the table is not under ## Exit codes"
    assert "`toolfid --help` prints this table" in " ".join(_readme_section())
    constants = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert TABLE_CODES == constants, (sorted(TABLE_CODES), sorted(constants))
    assert TABLE == {code: meaning.replace("|", "\\|") for code, meaning in errors.EXIT_CODES}
    assert _table_lines(ROOT / "docs" / "reporting.md") == _table_lines(ROOT / "README.md")
    shown = _console(["--help"], tmp_path / "home")
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    epilog = shown.stdout.split("\nexit codes:\n", 1)
    assert len(epilog) == 2, shown.stdout[-500:]
    listed = [int(m) for m in re.findall(r"^  (\d+) +\S", epilog[1], re.M)]
    assert listed == sorted(listed) and set(listed) == TABLE_CODES and len(listed) == len(TABLE_CODES), listed
    # each code's meaning, as --help wraps it, is the table's
    help_text = " ".join(epilog[1].split())
    for code, meaning in errors.EXIT_CODES:
        assert f"{code} {' '.join(meaning.split())}" in help_text, code


# --- the walk: one test per code, each registered with the code it reaches -------------------------------------

WALKS: dict[int, str] = {}
"""Exit code → the test that reaches it."""
REACHED: dict[int, list[str]] = {}
"""Exit code → what reached it in this session (filled by :func:`reached`)."""
RAN: set[int] = set()
"""The codes whose walk ran in this session (deselected ones, ``-m "not slow"``, did not)."""


def walk(code: int) -> Callable:
    """Register the decorated test as the walk to ``code``; it fails unless it reached ``code`` (:func:`reached`)."""
    def register(test: Callable) -> Callable:
        assert code not in WALKS, f"two walks to exit {code}: {WALKS[code]} and {test.__name__}"
        WALKS[code] = test.__name__

        @functools.wraps(test)
        def checked(*args: Any, **kwargs: Any) -> None:
            RAN.add(code)
            before = len(REACHED.get(code, []))
            test(*args, **kwargs)
            assert len(REACHED.get(code, [])) > before, f"{test.__name__} never reached exit {code}"
        return checked
    return register


def reached(code: int, proc: subprocess.CompletedProcess | subprocess.Popen, what: str) -> None:
    """``proc`` exited with ``code``: recorded as reached by ``what``."""
    got, err = proc.returncode, proc.stderr if isinstance(proc.stderr, str) else ""
    assert got == code, f"{what}: exit {got}, the table says {code}\n{err[-3000:]}"
    REACHED.setdefault(code, []).append(what)


def _one_line_error(stderr: str, prefix: str = "toolfid: error: ") -> str:
    """The whole of ``stderr`` is one line starting with ``prefix``, and no traceback: that line."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    assert len(lines) == 1 and stderr.endswith("\n") and lines[0].startswith(prefix), stderr[-3000:]
    return lines[0]


def _fixture_run(out: Path, *extra: Any, adapters: tuple[str, ...] = ("faithful", "broken"),
                 limit: int = N) -> list[Any]:
    named = [a for name in adapters for a in ("--adapter", f"{name}={FIX['adapters'][name]}")]
    return ["run", "--base", FIX["base"], *named,
            "--task", FIXTURE_TASK, "--device", "cpu", "--limit", limit, "--output", out, "--no-breakdown", *extra]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One fixture run (base, faithful, broken; 12 cases; non-inferiority gates) without ``--gate``: the walks to
    0, 1 and 2 read it, and ``--resume`` it without running a view again."""
    root = tmp_path_factory.mktemp("exit_codes")
    home, out = root / "home", root / "out"
    args = _fixture_run(out, "--metadata", NONINFERIORITY)
    proc = toolfid_here(args, home)
    return {"home": home, "out": out, "args": args, "proc": proc}


def _labels(out: Path) -> dict[str, str]:
    """View label → its verdict label, from each saved view's results."""
    labels = {}
    for results in sorted(out.glob("*/results.json")):
        meta = json.loads(results.read_text())["configs"][FIXTURE_TASK]["metadata"]["toolfid"]
        if "verdict" in meta:
            labels[results.parent.name] = meta["verdict"]["label"]
    return labels


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    """``toolfid check TEXT`` against a case that expects a call to ``get_weather``."""
    case = {"id": "w", "prompt": "Weather in Paris?", "tools": TOOLS, "gold_tool_name": "get_weather"}
    (tmp_path / "cases.jsonl").write_text(json.dumps(case) + "\n")
    return toolfid_here(["check", text, "--cases", tmp_path / "cases.jsonl", "--case", "w"], tmp_path / "home")


RUN = pytest.param("toolfid run", marks=pytest.mark.slow)
"""The walks that read the shared fixture run (a real model through lm-eval): the slow tier."""


@pytest.mark.parametrize("how", [RUN, "toolfid check"])
@walk(errors.EXIT_PASS)
def test_0_success(how: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A run that finishes exits 0 without --gate whatever its verdicts (here one FAIL and one UNDECIDED);
    ``toolfid check`` exits 0 for an answer that is what its case expects."""
    if how == "toolfid check":
        proc = _check(tmp_path, CALL)
        reached(0, proc, "toolfid check, a valid call where one is expected")
        assert proc.stdout.startswith("w: VALID get_weather") and proc.stderr == "", proc.stdout + proc.stderr
        return
    shared = request.getfixturevalue("shared")
    proc = shared["proc"]
    reached(0, proc, "toolfid run (one FAIL, one UNDECIDED) without --gate")
    assert _labels(shared["out"]) == {"faithful": "UNDECIDED", "broken": "FAIL"}  # exit 0 whatever the verdicts
    assert re.search(r"^faithful .* UNDECIDED ", proc.stdout, re.M) and re.search(r"^broken .* FAIL ", proc.stdout,
                                                                                      re.M), proc.stdout
    assert "error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("how", [RUN, "toolfid check"])
@walk(errors.EXIT_FAIL)
def test_1_an_adapter_failed_its_verdict(how: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``toolfid run --gate`` (the shared run, resumed: no view runs again) and ``toolfid gate`` on its folder: the
    broken adapter FAILs, which outranks the faithful one's UNDECIDED. ``toolfid check``: prose where the case
    expects a call."""
    if how == "toolfid check":
        proc = _check(tmp_path, "It is sunny in Paris.")
        reached(1, proc, "toolfid check, no call where one is expected")
        assert proc.stdout.startswith("w: NO_CALL") and proc.stderr == "", proc.stdout + proc.stderr
        return
    shared = request.getfixturevalue("shared")
    home, out = shared["home"], shared["out"]
    gated = toolfid_here([*shared["args"], "--resume", "--gate"], home)
    reached(1, gated, "toolfid run --gate with the broken adapter")
    assert gated.stderr.count("reusing") == 3 and "loading" not in gated.stderr, gated.stderr[-3000:]
    assert re.search(r"^FAIL +broken ", gated.stdout, re.M) and re.search(r"^UNDECIDED +faithful ", gated.stdout,
                                                                          re.M), gated.stdout[-3000:]
    reached(1, toolfid_here(["gate", out], home), "toolfid gate on a folder with a FAIL")
    reached(1, toolfid_here(["gate", out / "broken"], home), "toolfid gate on the failed view")


@pytest.mark.slow
@walk(errors.EXIT_UNDECIDED)
def test_2_an_undecided_verdict_and_none_failed(shared: dict[str, Any]) -> None:
    home, out = shared["home"], shared["out"]
    args = _fixture_run(out, "--metadata", NONINFERIORITY, "--resume", "--gate", adapters=("faithful",))
    gated = toolfid_here(args, home)
    reached(2, gated, "toolfid run --gate, the faithful adapter only (UNDECIDED)")
    assert gated.stderr.count("reusing") == 2 and "loading" not in gated.stderr, gated.stderr[-3000:]
    assert re.search(r"^UNDECIDED +faithful ", gated.stdout, re.M), gated.stdout
    assert not re.search(r"^FAIL ", gated.stdout, re.M), gated.stdout
    alone = toolfid_here(["gate", out / "faithful"], home)
    reached(2, alone, "toolfid gate on the undecided view")
    assert "non-inferiority not shown" in json.dumps(json.loads((out / "faithful" / "results.json").read_text())), \
        "the view is undecided for another reason than the one this walk relies on"


@pytest.mark.slow
@walk(errors.EXIT_STOP_CHECK)
def test_3_check_stops_finds_a_case_that_scores_differently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop rule made wrong on purpose (a row stopped at its third token once a call's end is possible: its
    answer cut short), caught by ``--check-stops``: the documented "please report it" exit."""
    from lm_eval_toolfid.integrations.lm_eval import stopping

    original = stopping.RowStopper.push

    def cut_after_three(self: Any, token: Any) -> Any:
        reason = original(self, token)
        return reason or ("stop" if self.call_end and self.count >= 3 else None)

    monkeypatch.setattr(stopping.RowStopper, "push", cut_after_three)
    proc = toolfid_here(_fixture_run(tmp_path / "out", "--check-stops", 4, adapters=("faithful",), limit=4),
                        tmp_path / "home")
    reached(3, proc, "toolfid run --check-stops under a wrong stop rule")
    assert "check-stops: base: 4 of 4 cases score differently without the early stop" in proc.stderr, \
        proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def _missing_adapter(tmp_path: Path) -> list[Any]:
    return ["run", "--base", FIX["base"], "--adapter", f"a={tmp_path / 'no-such-adapter'}", "--task", FIXTURE_TASK,
            "--device", "cpu", "--limit", 2, "--output", tmp_path / "out"]


def _demos_500(tmp_path: Path) -> list[Any]:
    return ["run", "--base", FIX["base"], "--adapter", f"a={FIX['adapters']['faithful']}", "--task", FIXTURE_TASK,
            "--demos", 500, "--device", "cpu", "--limit", 2, "--output", tmp_path / "out"]


INPUT_ERRORS: dict[str, Callable[[Path], tuple[list[Any], str]]] = {
    "a bad option": lambda tmp: (["run", "--adaptor", "x", "--base", FIX["base"]],
                                 "toolfid run: error: unrecognized option --adaptor; did you mean --adapter?"),
    "a missing adapter folder": lambda tmp: (_missing_adapter(tmp), "toolfid: error: adapter directory not found: "),
    "a task setting out of range (--demos 500)": lambda tmp: (_demos_500(tmp),
                                                              "toolfid: error: bad task setting demos: "),
    "a results folder that is not there": lambda tmp: (["gate", tmp / "no-such-run"],
                                                       f"toolfid: error: {tmp / 'no-such-run'}: no such results"),
}


@pytest.mark.parametrize("what", list(INPUT_ERRORS))
@walk(errors.EXIT_INPUT)
def test_4_an_input_error_is_one_line(what: str, tmp_path: Path) -> None:
    args, start = INPUT_ERRORS[what](tmp_path)
    proc = _console(args, tmp_path / "home")
    reached(4, proc, what)
    _one_line_error(proc.stderr, prefix=start)
    assert proc.stdout == ""
    assert not list(tmp_path.glob("out/*/manifest.json"))  # refused before any view ran


@walk(errors.EXIT_INTERNAL)
def test_5_an_internal_error_is_one_line_and_debug_shows_the_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval_toolfid.run.runner as runner

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug on purpose\nsecond line")

    monkeypatch.setattr(runner, "open_session", bug)
    args = _fixture_run(tmp_path / "out", adapters=("faithful",), limit=2)
    proc = toolfid_here(args, tmp_path / "home")
    reached(5, proc, "a RuntimeError on toolfid run's path")
    line = _one_line_error(proc.stderr, prefix="toolfid: internal error: ")
    assert line == ("toolfid: internal error: RuntimeError: a bug on purpose second line "
                    "(rerun with --debug for the traceback)"), line
    assert proc.stdout == ""
    with pytest.raises(RuntimeError, match="a bug on purpose"):  # --debug: the exception itself, traceback and all
        toolfid_here(["--debug", *args], tmp_path / "home")


@pytest.fixture
def served_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                 "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def _served_run(url: str, out: Path, *extra: Any) -> list[Any]:
    return ["run", "--server", url, "--base", "fake-base", "--adapter", "ad=fake-ad", "--task", FIXTURE_TASK,
            "--output", out, "--limit", 4, "--concurrency", 1, "--json", *extra]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("toolfid: error")]


@walk(errors.EXIT_SERVER)
def test_6_a_server_failing_past_its_retries_keeps_the_finished_views(tmp_path: Path, served_env: None) -> None:
    """The server answers 500 to every adapter request: exit 6, no metrics and no verdict for that view, the base
    view kept; with the server healthy again ``--resume`` asks only the adapter's requests."""
    broken = {"on": True}
    fake = Fake(plan=lambda n, body: "500" if broken["on"] and body.get("model") == "fake-ad" else None)
    url, stop = serve(fake)
    out, home = tmp_path / "out", tmp_path / "home"
    try:
        proc = toolfid_here(_served_run(url, out, "--max-retries", 0, "--gate"), home)
        reached(6, proc, "toolfid run --server, HTTP 500 past the retries")
        assert "Traceback" not in proc.stderr and proc.stdout == "" and "FAIL" not in proc.stderr, proc.stderr
        [line] = _error_lines(proc.stderr)
        assert "HTTP 500" in line and "finished views kept" in line and "(base)" in line, line
        assert (out / "base" / "manifest.json").is_file() and not (out / "ad").exists()
        broken["on"] = False
        fake.requests.clear()
        again = toolfid_here(_served_run(url, out, "--resume"), home)
    finally:
        stop()
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["model"] for r in fake.requests] == ["fake-ad"] * 4  # only what failed
    assert (out / "ad" / "manifest.json").is_file()


@walk(errors.EXIT_SERVER_AUTH)
def test_7_a_refused_key_is_one_line_and_keeps_the_finished_views(tmp_path: Path, served_env: None) -> None:
    url, stop = serve(Fake(keys={KEY}))
    try:
        proc = toolfid_here(_served_run(url, tmp_path / "none"), tmp_path / "home")
    finally:
        stop()
    reached(7, proc, "toolfid run --server without the key the server wants (HTTP 401)")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    [line] = [x for x in proc.stderr.splitlines() if x.strip()]  # one line (after a blank one that ends progress)
    assert line.startswith("toolfid: error: the server refused the request: "), line
    assert "HTTP 401" in line and "set OPENAI_API_KEY or --api-key-env NAME" in line, line
    # the key withdrawn at the adapter view's first request (403): the base view is kept
    fake = Fake(keys={KEY}, plan=lambda n, body: "revoke" if n == 4 else None)
    url, stop = serve(fake)
    out = tmp_path / "out"
    try:
        proc = toolfid_here(_served_run(url, out, "--api-key-env", "EXIT_CODES_KEY"), tmp_path / "home",
                            env={"EXIT_CODES_KEY": KEY})
    finally:
        stop()
    reached(7, proc, "toolfid run --server, the key refused mid-run (HTTP 403)")
    [line] = _error_lines(proc.stderr)
    assert "HTTP 403" in line and "finished views kept" in line and "Traceback" not in proc.stderr, proc.stderr
    assert KEY not in proc.stderr + proc.stdout
    assert (out / "base" / "manifest.json").is_file() and not (out / "ad").exists()


@pytest.mark.slow
@walk(errors.EXIT_INTERRUPTED)
def test_130_ctrl_c_keeps_the_finished_views_for_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (``KeyboardInterrupt``) as the adapter view is being saved: exit 130, the base view kept, and the
    resume command printed; ``--resume`` runs only the adapter view."""
    import lm_eval_toolfid.run.runner as runner

    real_save = runner.save_view
    saved: list[str] = []

    def interrupt_after_the_first(result: Any, *args: Any, **kwargs: Any) -> Any:
        if saved:
            raise KeyboardInterrupt
        saved.append(result.label)
        return real_save(result, *args, **kwargs)

    monkeypatch.setattr(runner, "save_view", interrupt_after_the_first)
    out, home = tmp_path / "out", tmp_path / "home"
    args = _fixture_run(out, adapters=("faithful",), limit=4)
    proc = toolfid_here(args, home)
    reached(130, proc, "Ctrl-C during toolfid run")
    assert saved == ["base"] and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[-3000:]
    assert f"toolfid: interrupted; finished views kept in {out}/ (base). Resume with: toolfid run " in proc.stderr
    assert (out / "base" / "manifest.json").is_file() and not (out / "faithful").exists()
    monkeypatch.setattr(runner, "save_view", real_save)
    again = toolfid_here([*args, "--resume"], home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "base: reusing" in again.stderr and "faithful: reusing" not in again.stderr, again.stderr[-3000:]
    assert (out / "faithful" / "manifest.json").is_file()


@walk(errors.EXIT_BROKEN_PIPE)
def test_141_the_reader_of_the_output_went_away(tmp_path: Path) -> None:
    """``toolfid check --jsonl < big | head -1``: the console script, its reader gone after one line; nothing more
    is printed (stderr empty)."""
    line = json.dumps({"text": CALL, "tools": TOOLS, "gold_tool_name": "get_weather"}) + "\n"
    (tmp_path / "in.jsonl").write_text(line * 4000)
    with open(tmp_path / "in.jsonl") as stdin:
        proc = subprocess.Popen([TOOLFID, "check", "--jsonl"], stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            assert json.loads(proc.stdout.readline())["kind"] == "valid"
            proc.stdout.close()
            err = proc.stderr.read().decode()
            proc.wait(timeout=120)
        finally:
            proc.kill()
    reached(141, proc, "toolfid check --jsonl | head -1")
    assert err == "", err


# --- every row has its walk ------------------------------------------------------------------------------------

def test_every_code_in_the_table_has_a_walk_and_every_walk_a_row() -> None:
    """A new row in the table without a walk here fails, and so does a walk to a code the table does not list.
    Each walk fails by itself unless it reached its code; where every walk ran in this session (none deselected),
    the codes reached are the table's."""
    assert set(WALKS) == TABLE_CODES, f"no walk: {sorted(TABLE_CODES - set(WALKS))}; " \
                                      f"no row: {sorted(set(WALKS) - TABLE_CODES)}"
    assert set(REACHED) <= RAN <= TABLE_CODES, (sorted(REACHED), sorted(RAN))
    if RAN == set(WALKS):
        assert set(REACHED) == TABLE_CODES, f"not reached: {sorted(TABLE_CODES - set(REACHED))}"
