"""``toolfid import-bfcl``: BFCL single-turn question/answer files → a case file
(the conversion is :mod:`lm_eval_toolfid.cases.bfcl`). Prints one summary line:
``wrote N cases (category n, ...) to FILE[; skipped K (reason: n, ...)]``."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from lm_eval_toolfid.cases.bfcl import convert, write_cases
from lm_eval_toolfid.core.errors import ToolfidError


def _answers_for(questions: list[str], answers: list[str]) -> list[Path | None]:
    """Pair each questions file with its answers file: by file name (answers may be files or the
    ``possible_answer`` folder); a single questions file takes a single answers file whatever its name."""
    if len(questions) == 1 and len(answers) == 1 and Path(answers[0]).is_file():
        return [Path(answers[0])]
    by_name: dict[str, Path] = {}
    for spec in answers:
        path = Path(spec).expanduser()
        if path.is_dir():
            by_name.update({p.name: p for p in sorted(path.glob("*.json*"))})
        elif path.is_file():
            by_name[path.name] = path
        else:
            raise ToolfidError(f"--answers {spec}: no such file or folder")
    used = [by_name.get(Path(q).name) for q in questions]
    unused = set(by_name.values()) - set(used)
    if unused and not any(Path(a).is_dir() for a in answers):
        raise ToolfidError(f"--answers {sorted(unused)[0]} matches no questions file by name")
    return used


def cmd_import_bfcl(args: argparse.Namespace) -> int:
    cases: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    first_skip: dict[str, str] = {}
    for qfile, afile in zip(args.questions, _answers_for(args.questions, list(args.answers or []))):
        done = convert(qfile, afile, names_only=args.names_only, category=args.category)
        cases += done.cases
        skipped.update(done.skipped)
        for reason, detail in done.first_skip.items():
            first_skip.setdefault(reason, detail)
    if not cases:
        reasons = ", ".join(f"{r}: {n}" for r, n in skipped.most_common())
        raise ToolfidError(f"no entry could be imported (skipped {sum(skipped.values())}: {reasons}); "
                           f"nothing written to {args.output}")
    counts = Counter(c["id"] for c in cases)
    dupes = sorted(i for i, n in counts.items() if n > 1)
    if dupes:
        raise ToolfidError(f"the same id appears in several questions files: {dupes[0]!r}")
    path = write_cases(cases, args.output)
    by_cat = Counter(c["category"] for c in cases)
    summary = ", ".join(f"{k} {v}" for k, v in by_cat.items())
    line = f"wrote {len(cases)} cases ({summary}) to {path}"
    if skipped:
        line += f"; skipped {sum(skipped.values())} (" + ", ".join(f"{r}: {n}" for r, n in skipped.most_common()) + ")"
    print(line)
    if args.verbose:
        for reason, detail in first_skip.items():
            print(f"  first skipped for {reason}: {detail}", file=sys.stderr)
    return 0


def add_import_bfcl_command(sub: Any) -> None:
    p = sub.add_parser("import-bfcl", help="convert BFCL single-turn question/answer files into a case file")
    p.add_argument("questions", nargs="+", help="BFCL question file(s), BFCL_v<N>_<category>.json")
    p.add_argument("--answers", action="append",
                   help="answers file(s) (repeatable), matched to questions files by file name, or the "
                        "possible_answer folder")
    p.add_argument("--output", "-o", required=True, help="case file to write (JSONL)")
    p.add_argument("--names-only", action="store_true",
                   help="gold calls by name only (no argument options); without --answers, single-function "
                        "questions take their one function as the gold call")
    p.add_argument("--category", help="category to record (default: from the file name)")
    p.add_argument("--verbose", "-v", action="store_true", help="name the first skipped entry of each reason")
    p.set_defaults(func=cmd_import_bfcl)



def register(sub: argparse._SubParsersAction) -> None:
    add_import_bfcl_command(sub)
