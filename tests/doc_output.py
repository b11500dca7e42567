"""Printed examples in README.md and docs/*.md are what the tool prints.

A fenced block that shows a command's output is marked on the line above it with ``<!-- output: SOURCE -->``, where
SOURCE names what printed it (``toolfid demo``: the bundled demo, see tests/test_lm_eval_cli.py). A test runs that
command once and compares every block marked with its source (:func:`mismatches`):

- every line of the block is a line of the output (trailing spaces aside), in the same order;
- a line that is only ``…`` stands for lines left out; without one, the block's lines follow each other in the
  output with nothing between them;
- ``...`` (three dots) inside a line stands for any text (a path, a time); ``…`` inside a line is the tool's own
  ellipsis (a cut cell) and must be printed as shown.

So a change of wording, a column or a number cannot leave a printed example behind. Plain Python, no model:
the comparison itself is unit-tested in tests/test_doc_commands.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_MARK = re.compile(r"^\s*<!--\s*output:\s*(.+?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)(```+|~~~+)")
ELIDED = "…"


@dataclass(frozen=True)
class PrintedBlock:
    file: str
    line: int  # the first line of the block's text
    source: str
    lines: tuple[str, ...]

    def where(self) -> str:
        return f"{self.file}:{self.line} ({self.source})"


def printed_blocks(path: Path) -> list[PrintedBlock]:
    """The marked output blocks of one Markdown file (the block's indentation removed)."""
    name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[PrintedBlock] = []
    k = 0
    while k < len(lines):
        mark = _MARK.match(lines[k])
        fence = _FENCE.match(lines[k + 1]) if mark and k + 1 < len(lines) else None
        if not (mark and fence):
            k += 1
            continue
        indent, ticks = len(fence.group(1)), fence.group(2)
        body: list[str] = []
        j = k + 2
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        out.append(PrintedBlock(name, k + 3, mark.group(1), tuple(body)))
        k = j + 1
    return out


def all_printed_blocks() -> list[PrintedBlock]:
    return [b for path in DOCS for b in printed_blocks(path)]


def _pattern(line: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in line.rstrip().split("...")) + r"\Z")


def _runs(block: PrintedBlock) -> list[list[tuple[int, str]]]:
    """The block's lines in runs that must be printed one after the other (``…`` lines part them)."""
    runs: list[list[tuple[int, str]]] = [[]]
    for number, line in enumerate(block.lines, start=block.line):
        if line.strip() == ELIDED:
            runs.append([])
        else:
            runs[-1].append((number, line))
    return [r for r in runs if r]


def mismatches(block: PrintedBlock, output: str) -> list[str]:
    """What of ``block`` the output does not print (empty: every run of lines printed as it stands, the runs in
    order; lines left out marked with ``…``)."""
    printed = [line.rstrip() for line in output.splitlines()]
    at, problems = 0, []
    for run in _runs(block):
        patterns = [_pattern(line) for _, line in run]
        best, best_len = None, -1
        for start in range(at, len(printed)):
            n = 0
            while n < len(run) and start + n < len(printed) and patterns[n].match(printed[start + n]):
                n += 1
            if n == len(run):
                best, best_len = start, n
                break
            if n > best_len:
                best, best_len = start, n
        if best_len == len(run):
            at = best + len(run)
            continue
        number, line = run[max(best_len, 0)]
        if best_len <= 0:
            why = "not printed (or not in this order)"
        else:
            why = (f"not printed after the line above it (printed: {printed[best + best_len][:80]!r}; lines left "
                   "out are marked with a line '…')" if best + best_len < len(printed) else "the output ends before")
        problems.append(f"{block.file}:{number}: {why}: {line.strip()[:100]}")
    return problems
