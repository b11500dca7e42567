"""The command line as a user meets it: lm-eval's spellings, one line for a misspelled option, grouped help, one
exit-code table (the code's, ``toolfid --help``'s and the docs' are the same), hub failures as input errors, and
``toolfid lm-eval --help`` saying what toolfid adds."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

from lm_eval_toolfid.calibration.nulls import DEFAULT_MULTIPLIERS
from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path
from lm_eval_toolfid.cli import _HubRetries, main, parse_args
from lm_eval_toolfid.core import errors
from lm_eval_toolfid.core.errors import EXIT_CODES, ToolfidError, exit_code_markdown, exit_code_text, guard


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lm_eval_toolfid"
TABLE_CODES = {code for code, _ in EXIT_CODES}


def _exit(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return info.value.code, out, err


# --- one exit-code table ---------------------------------------------------------------------------------------

def _returned_codes() -> set[int]:
    """Every exit code the package can produce: its EXIT_* constants, the int literals the command functions and the
    exit-code helpers return, and the ``exit_code`` of every error class."""
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (node.name.startswith("cmd_") or node.name == "exit_code"
                                                      or path.parent.name == "cli"):
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Constant) \
                            and type(ret.value.value) is int:
                        codes.add(ret.value.value)
                    if isinstance(ret, ast.Dict) and node.name == "exit_code":  # {True: 0, False: 1, None: 2}
                        codes |= {v.value for v in ret.values if isinstance(v, ast.Constant)}
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                        [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                    if any(getattr(t, "id", None) == "exit_code" for t in targets) \
                            and isinstance(stmt.value, ast.Constant):
                        codes.add(stmt.value.value)
    return codes


def test_every_exit_code_the_code_returns_is_in_the_one_table():
    returned = _returned_codes()
    assert {0, 1, 2, 3, 4, 5, 6, 7, 130, 141} <= returned  # the scan finds what it must
    assert returned <= TABLE_CODES, f"exit codes missing from EXIT_CODES: {sorted(returned - TABLE_CODES)}"
    constants = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert TABLE_CODES == constants  # and the table names no code the package does not have
    assert [c for c, _ in EXIT_CODES] == sorted(TABLE_CODES)


def test_toolfid_help_prints_exactly_the_table(capsys):
    code, out, _ = _exit(["--help"], capsys)
    assert code == 0
    assert out.rstrip("\n").endswith(exit_code_text(width=78))
    listed = [int(m) for m in re.findall(r"^  (\d+) ", out.split("exit codes:", 1)[1], re.M)]
    assert listed == [c for c, _ in EXIT_CODES]


def test_the_markdown_table_is_the_table_and_the_docs_that_carry_it_carry_it_whole():
    md = exit_code_markdown().splitlines()
    assert md[0] == "| Exit code | Meaning |" and len(md) == 2 + len(EXIT_CODES)
    assert [int(line.split("|")[1]) for line in md[2:]] == [c for c, _ in EXIT_CODES]
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        if md[0] in text:  # a page that shows the table shows all of it, as the code has it
            assert exit_code_markdown() in text, f"{doc.name}: the exit-code table differs from EXIT_CODES"


# --- lm-eval's spellings, misspellings, groups ---------------------------------------------------------------

def test_lm_eval_spellings_are_accepted_where_toolfid_has_the_option():
    args = parse_args(["run", "--base", "b", "--adapter", "a", "--batch_size", "8", "--output_path", "o",
                       "--log_samples"])
    assert (args.batch_size, args.output, args.log_samples) == (8, "o", True)
    assert parse_args(["run", "--base", "b", "--adapter", "a", "--out", "o"]).output == "o"  # the old spelling
    assert parse_args(["demo", "--batch_size", "4", "--output_path", "d"]).output == "d"
    assert parse_args(["calibrate", "--base", "b", "--adapter", "a", "--batch_size", "2", "--output", "c.json"]
                      ).batch_size == 2


@pytest.mark.parametrize("argv, line", [
    (["run", "--adaptor", "x", "--base", "y"], "toolfid run: error: unrecognized option --adaptor; did you mean --adapter?"),
    (["run", "--base", "y", "--adapter", "x", "--null_runs", "2"],
     "toolfid run: error: unrecognized option --null_runs; did you mean --null-runs?"),
    (["demo", "--verbse"], "toolfid demo: error: unrecognized option --verbse; did you mean --verbose?"),
    # an option of another command is named with its command, never swapped for an unrelated one of this command
    (["demo", "--adaptor", "x"], "toolfid demo: error: unrecognized option --adaptor; --adapter is an option of "
                                 "toolfid run and toolfid calibrate, not of toolfid demo; see toolfid demo --help"),
    (["gate", "runs", "--html", "r.html"], "toolfid gate: error: unrecognized option --html; --html is an option of "
                                           "toolfid run, toolfid demo and toolfid report, not of toolfid gate; see "
                                           "toolfid gate --help"),
    (["gate", "runs", "--junt", "j.xml"], "toolfid gate: error: unrecognized option --junt; did you mean --junit?"),
    (["rn", "--base", "y"], "toolfid: error: unknown command 'rn'; did you mean run?"),
])
def test_a_usage_error_is_one_line_naming_the_closest_option_and_exits_4(argv, line, capsys):
    code, out, err = _exit(argv, capsys)
    assert code == 4 and out == "" and err == line + "\n"


def test_a_run_without_adapters_says_how_to_give_them_and_exits_4(capsys):
    assert main(["run", "--base", "y"]) == 4
    out, err = capsys.readouterr()
    assert out == "" and err == ("toolfid: error: give the adapters to evaluate: --adapter [LABEL=]DIR (repeatable) "
                                 "or --adapters-from DIR_OR_FILE\n")


def test_run_help_groups_its_options_and_says_what_null_runs_costs(capsys):
    code, out, _ = _exit(["run", "--help"], capsys)
    assert code == 0
    headings = [h for h in re.findall(r"^(\S.*):$", out, re.M) if h != "options"]
    assert [h.split(" (")[0] for h in headings] == ["model", "adapters", "cases and prompt", "speed",
                                                    "served models", "outputs", "calibration", "gating and checks"]
    flat = " ".join(out.split())
    assert f"so {len(DEFAULT_MULTIPLIERS)}×K more views over every case" in flat
    model = out.split("\nmodel:\n", 1)[1].split("\nadapters:\n", 1)[0]
    assert "--base" in model and "--dtype" in model and "--batch-size" not in model


# --- hub failures are input errors ---------------------------------------------------------------------------

def test_a_hub_id_not_cached_while_offline_is_one_line_and_exit_4(tmp_path):
    """A real ``toolfid run`` (in this process: the console script's process is tests/test_wheel.py's and the other
    tests here): it fails before any model loads."""
    from .lm_eval_helpers import toolfid_here

    proc = toolfid_here(["run", "--base", "some-org/not-cached-model", "--revision", "v1.0", "--adapter",
                         fixture_paths()["adapters"]["faithful"], "--output", tmp_path / "out"], tmp_path / "home")
    errors_ = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 4, proc.stderr
    assert len(errors_) == 1 and "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert "some-org/not-cached-model" in errors_[0] and "HF_HUB_OFFLINE" in errors_[0]
    # the revision asked for is named, and the message suggests only options that exist
    assert "at revision v1.0" in errors_[0] and "local model folder" in errors_[0]
    assert "toolfid run --revision R" in errors_[0] and "revision=R in --model_args" in errors_[0]


def test_revision_is_an_option_of_run_recorded_in_the_base_identity():
    """``toolfid run --revision``: the plan carries it, the views run and record it as lm-eval's ``revision=``,
    and the base's identity pins the commit (a commit asked for is the commit)."""
    from lm_eval_toolfid.cli.run import plan_command
    from lm_eval_toolfid.pairing.identity import base_identity
    from lm_eval_toolfid.run.session import ModelSession

    commit = "0123456789abcdef0123456789abcdef01234567"
    args = parse_args(["run", "--base", "some-org/m", "--revision", commit, "--adapter", "a=/nowhere"])
    options = plan_command(args).plan.models
    assert options.revision == commit
    recorded = ModelSession("some-org/m", options).manifest_args
    assert recorded["revision"] == commit and base_identity(recorded)["revision"] == commit
    assert "revision" not in ModelSession("some-org/m", plan_command(parse_args(
        ["run", "--base", "some-org/m", "--adapter", "a=/nowhere"])).plan.models).manifest_args
    with pytest.raises(ToolfidError, match="--revision does not apply to --server"):
        plan_command(parse_args(["run", "--server", "http://127.0.0.1:1", "--base", "b", "--adapter", "a",
                                 "--revision", "v1"]))


def test_an_unreachable_hub_is_an_input_error_with_what_to_do(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    def load():  # what transformers raises when the hub does not answer and the files are not cached
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                      "in the cached files.")

    assert guard(load) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err and "check the network" in err
    assert guard(lambda: (_ for _ in ()).throw(OSError("disk on fire"))) == 5  # anything else stays a bug


def test_the_hubs_retry_warnings_become_one_line(capsys):
    log = logging.getLogger("huggingface_hub.utils._http.test")
    log.propagate = False
    handler = logging.StreamHandler()
    log.addHandler(handler)
    log.addFilter(_HubRetries())
    for i in range(1, 6):
        log.warning("'[Errno -2] Name or service not known' thrown while requesting HEAD https://huggingface.co/x")
        log.warning(f"Retrying in {2 ** i}s [Retry {i}/5].")
    log.warning("something else")
    err = capsys.readouterr().err
    assert err.splitlines() == ["toolfid: the Hugging Face hub does not answer; retrying for up to half a minute",
                                "something else"]


# --- toolfid lm-eval --help ----------------------------------------------------------------------------------

def test_lm_eval_help_starts_with_what_toolfid_adds(capsys):
    assert main(["lm-eval", "--help"]) == 0
    out = capsys.readouterr().out
    head, _, rest = out.partition("lm_eval's own help follows.")
    assert head.startswith("toolfid lm-eval:") and "usage:" in rest and "usage:" not in head
    flat = " ".join(head.split())
    assert str(tasks_path()) in flat and "runs as toolfid-hf" in flat and "--model hf-auto" in flat
    assert main(["lm-eval", "run", "--modle", "hf"]) == 4  # lm_eval's usage error: an input error, not "undecided"
    from lm_eval_toolfid.cli.lm_eval import _use_toolfid_model

    for argv in (["--model", "hf"], ["-M", "hf"], ["-m", "hf"], ["--model=hf"]):  # what the help says is true
        assert "toolfid-hf" in " ".join(_use_toolfid_model(argv)), argv
    assert _use_toolfid_model(["--model", "hf-auto"]) == ["--model", "hf-auto"]
