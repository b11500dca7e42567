"""``toolfid check``: score generations without a model.

Every outcome comes from the one scoring core (:func:`lm_eval_toolfid.scoring.check.check_text`)
and every summary from :func:`lm_eval_toolfid.scoring.metrics.summarize`; this module only finds the
inputs and prints the results.

Inputs: a positional text, ``--file F`` (one generation), JSONL on stdin (``{"text", "tools",
"gold_tool_name", ...}`` — any case fields — or ``{"case_id", "text"}`` with ``--cases``), or
``--samples samples_*.jsonl`` of an lm-eval run of this task (doc id -> case from ``--cases``; the
generation is ``filtered_resps[0]``). Exit status: 0 every generation is a valid call, 1 some are
not, 4 a usage or input error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from lm_eval_toolfid.cases.load import load_cases, parse_case_line
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case, ToolSpec
from lm_eval_toolfid.pairing.samples import iter_samples
from lm_eval_toolfid.scoring.check import Checked, check_text
from lm_eval_toolfid.scoring.compare import pair
from lm_eval_toolfid.scoring.metrics import summarize


def _tools_arg(spec: str) -> list[Any]:
    path = Path(spec).expanduser()
    try:
        raw = path.read_text(encoding="utf-8") if path.is_file() else spec
        tools = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ToolfidError(f"--tools: not a JSON list of tool specs or a file holding one ({exc})") from None
    return tools if isinstance(tools, list) else [tools]


def _case_from_fields(fields: dict[str, Any], where: str) -> Case:
    data = {"id": "input", "prompt": "(toolfid check)", **fields}
    return parse_case_line(json.dumps(data, ensure_ascii=False), where)


def _cases_by_id(spec: str | None) -> dict[str, Case]:
    if not spec:
        raise ToolfidError("--cases FILE|default is needed to look cases up by id")
    return {c.id: c for c in load_cases(spec)}


def _from_stdin(lines: Iterable[str], cases_spec: str | None) -> list[Checked]:
    cases: dict[str, Case] | None = None
    out: list[Checked] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"<stdin>:{lineno}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ToolfidError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ToolfidError(f"{where}: expected a JSON object with a string 'text'")
        text = row.pop("text")
        if "case_id" in row:
            cases = cases if cases is not None else _cases_by_id(cases_spec)
            cid = str(row["case_id"])
            if cid not in cases:
                raise ToolfidError(f"{where}: case_id {cid!r} is not in the case file {cases_spec}")
            out.append(check_text(text, cases[cid]))
        elif "tools" in row or "tool_spec" in row:
            row.setdefault("id", f"line-{lineno}")
            out.append(check_text(text, _case_from_fields(row, where)))
        else:
            out.append(check_text(text, None, case_id=str(row.get("id", f"line-{lineno}"))))
    if not out:
        raise ToolfidError("<stdin>: no generations given")
    return out


def _from_samples(path_spec: str, cases_spec: str | None) -> list[Checked]:
    path = Path(path_spec).expanduser()
    if not path.is_file():
        raise ToolfidError(f"samples file not found: {path}")
    cases = _cases_by_id(cases_spec or "default")
    out: list[Checked] = []
    for lineno, cid, text, _ in iter_samples(path):
        if cid not in cases:
            raise ToolfidError(f"{path}:{lineno}: case {cid!r} is not in the case file "
                               f"{cases_spec or 'default'}: pass the run's --cases")
        out.append(check_text(text, cases[cid]))
    if not out:
        raise ToolfidError(f"{path}: no samples in file")
    return out


def collect(args: argparse.Namespace, stdin: Any = None) -> list[Checked]:
    given = [x for x in (args.text is not None, bool(args.file), bool(args.samples)) if x]
    if len(given) > 1:
        raise ToolfidError("give one input: a TEXT argument, --file, --samples, or JSONL on stdin")
    if args.samples:
        return _from_samples(args.samples, args.cases)
    if args.text is None and not args.file:
        stdin = stdin if stdin is not None else sys.stdin
        if stdin.isatty():
            raise ToolfidError("nothing to check: give a TEXT argument, --file F, --samples F, or JSONL on stdin")
        return _from_stdin(stdin, args.cases)
    if args.file:
        try:
            text = Path(args.file).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolfidError(f"cannot read --file {args.file}: {exc}") from None
    else:
        text = args.text
    case: Case | None = None
    if args.case:
        cases = _cases_by_id(args.cases or "default")
        if args.case not in cases:
            raise ToolfidError(f"--case {args.case!r} is not in the case file {args.cases or 'default'}")
        case = cases[args.case]
    elif args.tools:
        fields: dict[str, Any] = {"tools": _tools_arg(args.tools)}
        if args.gold:
            fields["gold_tool_name"] = args.gold
        elif fields["tools"]:
            try:
                fields["gold_tool_name"] = ToolSpec.model_validate(fields["tools"][0]).name
            except ValidationError:
                pass  # the case validation below reports the bad spec in one line
        case = _case_from_fields(fields, "--tools")
    return [check_text(text, case)]


def _line(item: dict[str, Any]) -> str:
    head = f"{item['case_id']}: {item['kind'].upper()}"
    calls = ", ".join(f"{c['format']} {c['name'] or '?'}" for c in item["calls"])
    if item["kind"] == "valid":
        flag = " (hallucinated tool name)" if item["hallucinated"] else ""
        note = "" if item.get("schema_checked", True) else " [no tools given: shape only, schema not checked]"
        return f"{head} {item['name']}{flag} [{calls}]{note}"
    if item["kind"] in ("no_call", "malformed"):
        return head + (" (a '{' was written but nothing parsed)" if item["kind"] == "malformed" else "")
    where = f" at {item['path']}" if item["path"] else ""
    return f"{head} keyword={item['keyword']}{where}: {item['message']} [{calls}]"


def cmd_check(args: argparse.Namespace) -> int:
    checked = collect(args)
    items = [c.as_dict() for c in checked]
    summary = summarize([pair(c.case, c.outcome, None) for c in checked]) if len(checked) > 1 else None
    if args.json:
        if summary is None:
            print(json.dumps(items[0], indent=2, ensure_ascii=False, default=str))
        else:
            flat = {"n": summary.n, **summary.metrics, "outcome_counts": summary.outcome_counts}
            print(json.dumps({"results": items, "summary": flat}, indent=2, ensure_ascii=False, default=str))
    else:
        for item in items:
            print(_line(item))
        if summary is not None:
            counts = ", ".join(f"{k} {v}" for k, v in summary.outcome_counts.items())
            rates = ", ".join(f"{k} {v:.3f}" for k, v in summary.metrics.items() if v is not None)
            print(f"\n{summary.n} generations: {rates} ({counts})")
    return 0 if all(c.outcome.valid for c in checked) else 1


def add_check_command(sub: Any) -> None:
    p = sub.add_parser("check", help="score generation(s) without a model: format, outcome, error path")
    p.add_argument("text", nargs="?", help="the generation text (else --file, --samples or JSONL on stdin)")
    p.add_argument("--file", help="a file holding one generation")
    p.add_argument("--samples", help="an lm-eval samples_*.jsonl of this task to re-score (with --cases)")
    p.add_argument("--cases", help="case file (JSONL) or 'default'/'fixture', for --case, case_id and --samples")
    p.add_argument("--case", help="score against this case id of --cases (default set if --cases is not given)")
    p.add_argument("--tools", help="tool specs offered: a JSON list, or a file holding one")
    p.add_argument("--gold", help="with --tools: the expected tool (default: the first tool)")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.set_defaults(func=cmd_check)


def register(sub: argparse._SubParsersAction) -> None:
    add_check_command(sub)
