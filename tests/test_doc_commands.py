"""Every ``toolfid …`` and ``lm_eval …`` command the docs show exists: its subcommand and each option.

The commands are read from README.md and docs/*.md: every line of a fenced code block (``\\`` continuations
joined, a leading ``$ `` prompt, ``VAR=value`` prefixes, pipes, ``&&``, ``;`` and ``$(…)`` handled) and every
inline code span that starts with a command. Each is checked against the real argparse parsers: toolfid's
(:func:`lm_eval_toolfid.cli.build_parser`) and lm-eval's own ``run`` parser (``lm_eval._cli.harness.HarnessCLI``,
what the ``lm_eval`` command parses with; ``toolfid lm-eval``, ``python -m lm_eval`` and ``accelerate launch
-m lm_eval`` pass their arguments to it). Option names must match exactly (argparse would accept a unique
prefix, a doc should not rely on it), hidden options do not count as documented, and a literal value of an
option with fixed choices must be one of them. Placeholders (``BASE``, ``/path/to/x``, ``…``, ``[--gate]``)
are fine: only the command's shape is checked, nothing runs. A unit test, no subprocess: well under a second.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROGRAMS = {"toolfid": "toolfid", "lm_eval": "lm_eval", "lm-eval": "lm_eval"}
_FENCE = re.compile(r"^\s*(```+|~~~+)")
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_NUMBER = re.compile(r"^-\d")
_PLACEHOLDER = re.compile(r"[A-Z]{2,}|[<>$…]|\.\.\.|/path/")
_SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")", "$(", "`"}


@dataclass(frozen=True)
class Command:
    file: str
    line: int
    program: str  # "toolfid" or "lm_eval"
    args: tuple[str, ...]
    text: str

    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.text.strip()[:160]}"


def _split_segments(text: str) -> list[list[str]] | None:
    """A shell line → its simple commands (token lists), split at pipes, ``&&``, ``;`` and ``$(…)``;
    None when the line does not tokenize as shell (output text, prose)."""
    text = text.replace("$(", " $( ").replace("`", " ` ")
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS or set(token) <= set("|&;()"):
            segments.append([])
        elif token == "$":  # the '$' of a '$(' the lexer split from its parenthesis
            continue
        else:
            segments[-1].append(token)
    return [s for s in segments if s]


def _program(tokens: list[str]) -> tuple[str, list[str]] | None:
    """The checked program a simple command runs and its arguments: ``toolfid``/``lm_eval`` (any path
    to them), ``python -m lm_eval``, ``accelerate launch … -m lm_eval``; after a leading ``$`` prompt and
    ``VAR=value`` prefixes."""
    i = 0
    while i < len(tokens) and (tokens[i] == "$" or _ASSIGN.match(tokens[i])):
        i += 1
    rest = tokens[i:]
    if not rest:
        return None
    name = Path(rest[0]).name
    if name in PROGRAMS:
        return PROGRAMS[name], rest[1:]
    if (name.startswith("python") or name == "accelerate") and "-m" in rest:
        k = rest.index("-m")
        if k + 1 < len(rest) and rest[k + 1] in PROGRAMS:
            return PROGRAMS[rest[k + 1]], rest[k + 2:]
    return None


def _commands_in(text: str, file: str, line: int) -> list[Command]:
    segments = _split_segments(text)
    if segments is None:
        return []
    out = []
    for tokens in segments:
        found = _program(tokens)
        if found is not None:
            out.append(Command(file, line, found[0], tuple(found[1]), text))
    return out


def _logical_lines(lines: list[str], start: int) -> list[tuple[int, str]]:
    """A fenced block's lines with ``\\`` continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for k, raw in enumerate(lines):
        number = start + k
        text = raw.rstrip()
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text.lstrip()
        if text.endswith("\\"):
            pending = (number, text[:-1])
            continue
        pending = None
        stripped = text.lstrip()
        out.append((number, stripped[2:] if stripped.startswith("$ ") else stripped))
    if pending is not None:
        out.append(pending)
    return out


def doc_commands(path: Path) -> list[Command]:
    """Every checked command in one Markdown file: fenced blocks, then inline code spans outside them."""
    name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Command] = []
    block: list[str] | None = None
    block_start = 0
    fence = ""
    for number, line in enumerate(lines, start=1):
        match = _FENCE.match(line)
        if block is None and match:
            block, block_start, fence = [], number + 1, match.group(1)[0] * 3
            continue
        if block is not None:
            if line.strip().startswith(fence):
                for first, text in _logical_lines(block, block_start):
                    out += _commands_in(text, name, first)
                block = None
            else:
                block.append(line)
            continue
        for span in _INLINE.findall(line):
            words = span.split()
            if words and Path(words[0]).name in PROGRAMS:
                out += _commands_in(span, name, number)
    return out


# --- the real parsers ---------------------------------------------------------------------------

@functools.cache
def _toolfid_parser() -> argparse.ArgumentParser:
    from lm_eval_toolfid.cli import build_parser

    return build_parser()


@functools.cache
def _lm_eval_parser() -> argparse.ArgumentParser:
    from lm_eval._cli.harness import HarnessCLI  # lm-eval 0.4.13: what `lm_eval` / `lm-eval` parse with

    return HarnessCLI()._parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _check_options(parser: argparse.ArgumentParser, args: list[str], what: str) -> list[str]:
    """Each option of ``args`` against ``parser``: exact name, not hidden, a literal value among its choices."""
    problems = []
    known = parser._option_string_actions
    for k, token in enumerate(args):
        token = token.strip("[]")
        if not token.startswith("-") or token == "-" or token == "--" or _NUMBER.match(token):
            continue
        option, eq, value = token.partition("=")
        action = known.get(option)
        if action is None:
            problems.append(f"{what}: unknown option {option}")
            continue
        if action.help == argparse.SUPPRESS:
            problems.append(f"{what}: {option} is a hidden option (not in --help); use its documented spelling")
        if action.nargs == 0 and eq:
            problems.append(f"{what}: {option} takes no value")
        if action.choices is not None and action.nargs in (None, "?"):
            given = value if eq else (args[k + 1] if k + 1 < len(args) else "")
            given = given.strip("[]")
            if given and not given.startswith("-") and not _PLACEHOLDER.search(given) \
                    and given not in action.choices:
                problems.append(f"{what}: {option} {given!r} is not one of {sorted(map(str, action.choices))}")
    return problems


def check_command(command: Command) -> list[str]:
    """What is wrong with one documented command (empty when its subcommand and options all exist)."""
    args = [a for a in command.args if a.strip("[]") not in ("", "...", "…")]
    if command.program == "lm_eval":
        return _check_lm_eval(args)
    parser = _toolfid_parser()
    i = 0
    while i < len(args) and args[i].startswith("-"):  # toolfid --debug / --version before the command
        i += 1
    problems = _check_options(parser, args[:i], "toolfid")
    if i >= len(args):
        return problems
    name = args[i]
    if _PLACEHOLDER.fullmatch(name) or name.isupper():  # `toolfid COMMAND ...`
        return problems
    commands = _subparsers(parser)
    if name not in commands:
        return problems + [f"toolfid: unknown subcommand {name!r} (toolfid has: {', '.join(sorted(commands))})"]
    if name == "lm-eval":  # everything after it belongs to lm_eval
        return problems + [f"toolfid lm-eval → {p}" for p in _check_lm_eval(args[i + 1:])]
    return problems + _check_options(commands[name], args[i + 1:], f"toolfid {name}")


def _check_lm_eval(args: list[str]) -> list[str]:
    commands = _subparsers(_lm_eval_parser())
    if args and args[0] in commands:  # lm_eval run|ls|validate …
        name, rest = args[0], args[1:]
    else:  # the legacy form: no subcommand means `run`
        name, rest = "run", args
    if name != "run" and not rest:
        return []
    return _check_options(commands[name], rest, f"lm_eval {name}")


def all_doc_commands() -> list[Command]:
    return [c for path in DOCS for c in doc_commands(path)]


# --- the tests ----------------------------------------------------------------------------------

def test_every_documented_command_exists() -> None:
    commands = all_doc_commands()
    problems = [f"{c.where()}\n    {p}" for c in commands for p in check_command(c)]
    assert not problems, "documented commands that do not parse:\n" + "\n".join(problems)


def test_the_docs_show_commands_of_both_programs() -> None:
    """The extraction finds what it is meant to: the README's demo, `toolfid run` with an adapter, the two-run
    `lm_eval` flow, and commands in several docs pages (an extractor that finds nothing passes everything)."""
    commands = all_doc_commands()
    readme = [c for c in commands if c.file == "README.md"]
    assert any(c.program == "toolfid" and c.args[:1] == ("demo",) for c in readme)
    assert any(c.program == "toolfid" and c.args[:1] == ("run",) and "--adapter" in c.args for c in readme)
    assert any(c.program == "lm_eval" and "--model_args" in c.args for c in readme)
    assert len({c.file for c in commands}) >= 6
    assert len(commands) >= 60


def _parse(text: str) -> list[list[str]]:
    return [[c.program, *c.args] for c in _commands_in(text, "x.md", 1)]


def test_extraction_handles_shell_forms() -> None:
    assert _parse("$ toolfid demo") == [["toolfid", "demo"]]
    assert _parse("OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 .venv/bin/toolfid run --base B --adapter A  # note") == [
        ["toolfid", "run", "--base", "B", "--adapter", "A"]]
    assert _parse("my_model_cli | toolfid check - --tools tools.json") == [
        ["toolfid", "check", "-", "--tools", "tools.json"]]
    assert _parse('TASKS=$(toolfid tasks-path) && lm_eval --include_path "$TASKS" --tasks t') == [
        ["toolfid", "tasks-path"], ["lm_eval", "--include_path", "$TASKS", "--tasks", "t"]]
    assert _parse("accelerate launch --multi_gpu --num_processes 2 -m lm_eval --tasks t --batch_size 8") == [
        ["lm_eval", "--tasks", "t", "--batch_size", "8"]]
    assert _parse("tool_use_fidelity — base's answers (prose, not a command)") == []
    lines = _logical_lines(["toolfid run --base B \\", "  --adapter A \\", "  --gate", "toolfid demo"], 10)
    assert lines == [(10, "toolfid run --base B  --adapter A  --gate"), (13, "toolfid demo")]


@pytest.mark.parametrize(("text", "expected"), [
    ("toolfid run --base B --adapter A --engine vllm", "toolfid run: unknown option --engine"),
    ("toolfid runn --base B", "toolfid: unknown subcommand 'runn'"),
    ("toolfid calibrate --from-results runs/ --out c.json", "toolfid calibrate: --out is a hidden option"),
    ("toolfid run --base B --adapter A --batch", "toolfid run: unknown option --batch"),  # a prefix is not a name
    ("toolfid run --base B --adapter A --prompt-style fancy", "toolfid run: --prompt-style 'fancy' is not one of"),
    ("toolfid run --base B --adapter A --gate=yes", "toolfid run: --gate takes no value"),
    ("lm_eval --tasks t --model hf --batch-size 8", "lm_eval run: unknown option --batch-size"),
    ("toolfid lm-eval --tasks t --output out", "toolfid lm-eval → lm_eval run: unknown option --output"),
    ("python -m lm_eval run --tasks t --adapter A", "lm_eval run: unknown option --adapter"),
])
def test_a_wrong_command_is_named(text: str, expected: str) -> None:
    [command] = _commands_in(text, "x.md", 7)
    problems = check_command(command)
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize("text", [
    "toolfid run --base BASE --adapter ADAPTER [--adapter NAME=DIR ...] [--cases FILE] [--gate]",
    "toolfid --debug check '<tool_call>{}</tool_call>' --tools tools.json --json",
    "toolfid lm-eval --tasks tool_use_fidelity --model hf --model_args pretrained=B,peft=A --batch_size 16",
    "lm_eval --tasks tool_use_fidelity --include_path $TASKS --model vllm --model_args pretrained=B --output_path o",
    "toolfid power --p 0.9 --n 268 --drop 0.10 --floor -0.05",
    "toolfid COMMAND --help",
])
def test_a_right_command_passes(text: str) -> None:
    [command] = _commands_in(text, "x.md", 1)
    assert check_command(command) == []


def test_a_doc_file_is_read_with_line_numbers(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("intro `toolfid run --base B --adapter A --nope` here\n\n```bash\n# a comment\n"
                   "toolfid demo \\\n  --no-breakdown\n```\n\n```\ntoolfid: error: output text\n```\n",
                   encoding="utf-8")
    commands = doc_commands(doc)
    assert [(c.line, c.args) for c in commands] == [
        (1, ("run", "--base", "B", "--adapter", "A", "--nope")), (5, ("demo", "--no-breakdown"))]
    assert check_command(commands[0]) == ["toolfid run: unknown option --nope"]


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_OUTSIDE = re.compile(r"(?<![\w.])\.\./(?!\.\.)[\w.-]+|/work/|(?<![\w/.])shared/")


def outside_references(path: Path, root: Path = REPO) -> list[str]:
    """Links of one Markdown file that do not point at a file under ``root``, and code spans naming a path
    outside it (``../something``, ``/work/…``, ``shared/…``)."""
    problems = []
    name = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        where = f"{name}:{number}"
        for target in _LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = (path.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(root) or not resolved.exists():
                problems.append(f"{where}: link to {target} (not a file of the repository)")
        for span in re.findall(r"`([^`]+)`", line):
            first = span.split()[0] if span.split() else ""
            target = (path.parent / first).resolve()
            inside = first.startswith("../") and target.is_relative_to(root) and target.exists()
            if _OUTSIDE.search(span) and not inside:
                problems.append(f"{where}: `{span[:80]}` points outside the repository")
    return problems


def test_docs_link_only_to_files_in_the_repository() -> None:
    """Every relative link of README.md and docs/*.md points at a file of the repository, and no text points
    at a path outside it: a user reading the docs has only the repository."""
    problems = [p for path in DOCS for p in outside_references(path)]
    assert not problems, "\n".join(problems)


def test_an_outside_reference_is_named(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("x\n", encoding="utf-8")
    page = root / "docs" / "page.md"
    page.write_text("see [the readme](../README.md) and [missing](gone.md)\n"
                    "measured on an H200 (`../shared/gpu.md`), data in `/work/shared/bfcl`\n", encoding="utf-8")
    assert outside_references(page, root) == [
        "docs/page.md:1: link to gone.md (not a file of the repository)",
        "docs/page.md:2: `../shared/gpu.md` points outside the repository",
        "docs/page.md:2: `/work/shared/bfcl` points outside the repository"]


# --- printed examples (tests/doc_output.py; compared with a real demo run in tests/test_lm_eval_cli.py) --------

SOURCES = {"toolfid demo": "tests/test_lm_eval_cli.py", "toolfid gate on the demo's output": "tests/test_lm_eval_cli.py",
           "toolfid check with tools.json": "tests/test_check.py",
           "toolfid run --engine-check, 2 of 4 cases moved": "tests/test_engine_noise.py",
           "toolfid run --engine-check, 1 of 4 cases moved": "tests/test_engine_noise.py"}


def test_every_printed_example_names_a_source_a_test_compares() -> None:
    """A marked block whose source no test runs would never be compared; and the README shows no output block
    unmarked (every plain fenced block of it that is not shell commands is what a command prints)."""
    from .doc_output import all_printed_blocks

    blocks = all_printed_blocks()
    assert [b.where() for b in blocks if b.source not in SOURCES] == []
    assert len([b for b in blocks if b.file == "README.md"]) >= 2
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    unmarked = [n + 1 for n, line in enumerate(lines) if line.strip() == "```" and
                not any(f"{b.line}" == str(n + 2) for b in blocks) and
                sum(1 for x in lines[:n] if x.strip().startswith("```")) % 2 == 0]
    assert unmarked == [], f"README.md: output blocks not marked <!-- output: SOURCE --> at lines {unmarked}"


def test_a_printed_example_is_compared_line_by_line_with_elisions_marked() -> None:
    from .doc_output import PrintedBlock, mismatches

    output = "head /a/long/path: 72 cases\n\nrow one\nrow two\nrow three\nlegend\n"

    def block(*lines: str) -> PrintedBlock:
        return PrintedBlock("x.md", 10, "toolfid demo", lines)

    assert mismatches(block("head ...: 72 cases", "", "row one", "…", "legend"), output) == []
    assert mismatches(block("row two", "row three"), output) == []
    # a line cut out without a mark, a changed line, and the wrong order are each named with file:line
    [cut] = mismatches(block("row one", "row three"), output)
    assert cut.startswith("x.md:11: not printed after the line above it")
    [changed] = mismatches(block("row one", "row 2"), output)
    assert changed.startswith("x.md:11: ") and "row 2" in changed
    assert mismatches(block("legend", "…", "row one"), output)[0].startswith("x.md:12: not printed")
    assert mismatches(block("head ...: 73 cases"), output) != []
