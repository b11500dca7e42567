"""``toolfid check``: score generations without a model.

Every outcome comes from the one scoring core (:func:`lm_eval_toolfid.scoring.check.check_text`)
and every summary from :func:`lm_eval_toolfid.scoring.metrics.summarize`; this module only finds the
inputs and prints the results.

Inputs (one of): a positional TEXT, ``-`` (one generation read whole from stdin), ``--file F``
(``--file -``: stdin), JSONL on stdin when no TEXT is given and stdin is not a terminal (``{"text",
"tools", "gold_tool_name", ...}`` — any case fields — or ``{"case_id", "text"}`` with ``--cases``), or
``--samples samples_*.jsonl`` of an lm-eval run of this task (doc id -> case from ``--cases``; the
generation is ``filtered_resps[0]``). Outputs: a line per generation (default), one JSON document
(``--json``), or JSON lines written as each generation is scored, then ``{"summary": ...}``
(``--jsonl``). Exit status: 0 every generation is what its case expects (a valid call; no call on an
irrelevance case), 1 some are not, 4 a usage or input error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

from pydantic import ValidationError

from lm_eval_toolfid.cases.load import load_cases, parse_case_line
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case, PairScore, Summary, ToolSpec
from lm_eval_toolfid.pairing.samples import iter_sample_answers
from lm_eval_toolfid.scoring.check import Checked, check_text
from lm_eval_toolfid.scoring.compare import pair
from lm_eval_toolfid.scoring.metrics import summarize

STDIN = "-"


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


def _stdin_text(stdin: Any) -> str:
    """One generation, all of stdin. Empty stdin (no bytes at all) is an input error; an empty
    generation is checked with ``toolfid check ''``."""
    try:
        text = stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolfidError(f"<stdin>: cannot read the generation ({exc})") from None
    if text == "":
        raise ToolfidError("<stdin>: empty: no generation text to check (to check an empty generation: "
                           "toolfid check '')")
    return text


def _from_stdin(lines: Iterable[str], cases_spec: str | None) -> Iterator[Checked]:
    """JSONL on stdin, scored line by line as it arrives."""
    cases: dict[str, Case] | None = None
    n = 0
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
        n += 1
        if "case_id" in row:
            cases = cases if cases is not None else _cases_by_id(cases_spec)
            cid = str(row["case_id"])
            if cid not in cases:
                raise ToolfidError(f"{where}: case_id {cid!r} is not in the case file {cases_spec}")
            yield check_text(text, cases[cid])
        elif "tools" in row or "tool_spec" in row:
            row.setdefault("id", f"line-{lineno}")
            yield check_text(text, _case_from_fields(row, where))
        else:
            yield check_text(text, None, case_id=str(row.get("id", f"line-{lineno}")))
    if not n:
        raise ToolfidError("<stdin>: no generations given (expected JSON lines with a 'text')")


def _from_samples(path_spec: str, cases_spec: str | None) -> Iterator[Checked]:
    path = Path(path_spec).expanduser()
    if not path.is_file():
        raise ToolfidError(f"samples file not found: {path}")
    cases = _cases_by_id(cases_spec or "default")
    n = 0
    for lineno, cid, text, _ in iter_sample_answers(path):
        if cid not in cases:
            raise ToolfidError(f"{path}:{lineno}: case {cid!r} is not in the case file "
                               f"{cases_spec or 'default'}: pass the run's --cases")
        n += 1
        yield check_text(text, cases[cid])
    if not n:
        raise ToolfidError(f"{path}: no samples in file")


def _one_case(args: argparse.Namespace) -> Case | None:
    """The case a single generation is scored against: ``--case`` of ``--cases``, or ``--tools``."""
    if args.case:
        cases = _cases_by_id(args.cases or "default")
        if args.case not in cases:
            raise ToolfidError(f"--case {args.case!r} is not in the case file {args.cases or 'default'}")
        return cases[args.case]
    if args.tools:
        fields: dict[str, Any] = {"tools": _tools_arg(args.tools)}
        if args.gold:
            fields["gold_tool_name"] = args.gold
        elif fields["tools"]:
            try:
                fields["gold_tool_name"] = ToolSpec.model_validate(fields["tools"][0]).name
            except ValidationError:
                pass  # the case validation below reports the bad spec in one line
        else:
            fields["gold_tool_name"] = None  # --tools '[]': no tool at all, so no call is expected
        return _case_from_fields(fields, "--tools")
    return None


def checked_generations(args: argparse.Namespace, stdin: Any = None) -> Iterator[Checked]:
    """Every generation of the input, scored, one at a time (a stream is never read ahead)."""
    stdin = stdin if stdin is not None else sys.stdin
    given = [x for x in (args.text is not None, bool(args.file), bool(args.samples)) if x]
    if len(given) > 1:
        raise ToolfidError("give one input: a TEXT argument (or - for stdin), --file, --samples, or JSONL on stdin")
    if args.samples:
        yield from _from_samples(args.samples, args.cases)
        return
    if args.text is None and not args.file:
        if stdin.isatty():
            raise ToolfidError("nothing to check: give a TEXT argument, - (the text on stdin), --file F, "
                               "--samples F, or JSONL on stdin")
        yield from _from_stdin(stdin, args.cases)
        return
    case = _one_case(args)
    if args.text == STDIN or args.file == STDIN:
        text = _stdin_text(stdin)
    elif args.file:
        try:
            text = Path(args.file).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolfidError(f"cannot read --file {args.file}: {exc}") from None
    else:
        text = args.text
    yield check_text(text, case)


def _yes_no(value: bool | None) -> str:
    return "yes" if value else "no"


def _gold(item: dict[str, Any]) -> str:
    """`` gold_tool=yes gold_args=no`` for the gold results the case has ('' when it has none)."""
    parts = [f"{k}={_yes_no(item[k])}" for k in ("gold_tool", "gold_args") if item.get(k) is not None]
    return (" " + " ".join(parts)) if parts else ""


def _line(item: dict[str, Any]) -> str:
    head = f"{item['case_id']}: {item['kind'].upper()}"
    calls = ", ".join(f"{c['format']} {c['name'] or '?'}" for c in item["calls"])
    gold = _gold(item)
    if item["kind"] == "valid":
        flag = " (hallucinated tool name)" if item["hallucinated"] else ""
        note = "" if item.get("schema_checked", True) else " [no tools given: shape only, schema not checked]"
        if not item.get("as_expected", True):
            note += " (this irrelevance case expects no call)"
        return f"{head} {item['name']}{flag} [{calls}]{gold}{note}"
    if item["kind"] in ("no_call", "malformed"):
        expected = " (no call: what this irrelevance case expects)" if item.get("as_expected") else ""
        return head + (" (a '{' was written but nothing parsed)" if item["kind"] == "malformed" else "") + gold \
            + expected
    where = f" at {item['path']}" if item["path"] else ""
    return f"{head} keyword={item['keyword']}{where}: {item['message']} [{calls}]{gold}"


def summary_dict(summary: Summary) -> dict[str, Any]:
    """The summary as ``--json`` and ``--jsonl`` print it: ``n``, every metric (null: no denominator),
    the denominators, the outcome counts."""
    return {"n": summary.n, **summary.metrics, "denominators": summary.denominators,
            "outcome_counts": summary.outcome_counts}


def _summary_line(summary: Summary) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in summary.outcome_counts.items())
    rates = ", ".join(f"{k} {v:.3f}" for k, v in summary.metrics.items() if v is not None)
    return f"\n{summary.n} generations: {rates} ({counts})"


def _record(checked: Checked) -> PairScore:
    """What the summary keeps of a scored generation (not its text: a long stream stays small)."""
    return pair(checked.case, checked.outcome.model_copy(update={"text": None}), None)


def cmd_check(args: argparse.Namespace) -> int:
    records: list[PairScore] = []
    items: list[dict[str, Any]] = []
    all_expected = True
    for checked in checked_generations(args):
        item = checked.as_dict()
        records.append(_record(checked))
        all_expected = all_expected and checked.as_expected
        if args.jsonl:
            print(json.dumps(item, ensure_ascii=False, default=str), flush=True)
        elif args.json:
            items.append(item)
        else:
            print(_line(item), flush=True)
    summary = summarize(records)
    if args.jsonl:
        print(json.dumps({"summary": summary_dict(summary)}, ensure_ascii=False, default=str), flush=True)
    elif args.json:
        doc: Any = items[0] if len(items) == 1 else {"results": items, "summary": summary_dict(summary)}
        print(json.dumps(doc, indent=2, ensure_ascii=False, default=str))
    elif len(records) > 1:
        print(_summary_line(summary))
    return 0 if all_expected else 1


def add_check_command(sub: Any) -> None:
    p = sub.add_parser("check", help="score generation(s) without a model: format, outcome, error path, gold values")
    p.add_argument("text", nargs="?",
                   help="the generation text; - reads one generation from stdin (else --file, --samples, or JSONL "
                        "on stdin)")
    p.add_argument("--file", help="a file holding one generation (- for stdin)")
    p.add_argument("--samples", help="an lm-eval samples_*.jsonl of this task to re-score (with --cases)")
    p.add_argument("--cases", help="case file (JSONL) or 'default'/'fixture', for --case, case_id and --samples")
    p.add_argument("--case", help="score against this case id of --cases (default set if --cases is not given)")
    p.add_argument("--tools", help="tool specs offered: a JSON list, or a file holding one")
    p.add_argument("--gold", help="with --tools: the expected tool (default: the first tool)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document at the end")
    out.add_argument("--jsonl", action="store_true",
                     help="print one JSON record per generation as it is scored, then a {\"summary\": ...} line")
    p.set_defaults(func=cmd_check)


def register(sub: argparse._SubParsersAction) -> None:
    add_check_command(sub)
