"""CI gating: exit codes from verdicts, and JUnit XML (one testcase per adapter × gate)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import EXIT_FAIL, EXIT_PASS, EXIT_UNDECIDED, ToolfidError
from lm_eval_toolfid.core.fsutil import atomic_write_bytes
from lm_eval_toolfid.reporting.load import Run


def gated_runs(runs: list[Run]) -> list[Run]:
    """Adapter runs of the task (base runs and other tasks have no verdict to gate on)."""
    return [r for r in runs if r.row is not None and r.adapter]


def exit_code(runs: list[Run]) -> int:
    """0 all pass, 1 any fail, 2 undecided (and none failed)."""
    labels = [r.verdict_label for r in gated_runs(runs)]
    if not labels:
        raise ToolfidError("nothing to gate: no adapter run of tool_use_fidelity among the results")
    if "FAIL" in labels:
        return EXIT_FAIL
    if "UNDECIDED" in labels:
        return EXIT_UNDECIDED
    return EXIT_PASS


def summary_lines(runs: list[Run]) -> list[str]:
    lines = []
    for r in gated_runs(runs):
        verdict = r.verdict or {}
        gates = verdict.get("gates", [])
        failed = [g["name"] for g in gates if g.get("passed") is False]
        unmeasured = [g["name"] for g in gates if g.get("measured") is False]  # cannot decide: named apart
        undecided = [g["name"] for g in gates if g.get("passed") is None and g["name"] not in unmeasured]
        why = (f"failed: {', '.join(failed)}" if failed else f"undecided: {', '.join(undecided)}" if undecided
               else "" if unmeasured
               else verdict.get("reason") or ("all gates hold" if verdict else "no verdict (unpaired run)"))
        if unmeasured:
            why += ("; " if why else "") + f"not measured: {', '.join(unmeasured)}"
        lines.append(f"{r.verdict_label:<9} {r.label}  ({why})  [{r.source}]")
    return lines


def junit_xml(runs: list[Run]) -> bytes:
    """JUnit XML: a testsuite per adapter, a testcase per gate; failure for failed, skipped for undecided."""
    suites = ET.Element("testsuites", name="toolfid")
    total = failures = skipped = 0
    for run in gated_runs(runs):
        suite = ET.SubElement(suites, "testsuite", name=f"tool_use_fidelity.{run.label}")
        verdict = run.verdict or {}
        gates: list[dict[str, Any]] = list(verdict.get("gates") or [])
        if not gates:
            gates = [{"name": "verdict", "value": None, "threshold": None, "op": "", "passed": None,
                      "note": run.toolfid.get("pairing") or "no verdict in the results"}]
        s_fail = s_skip = 0
        for g in gates:
            case = ET.SubElement(suite, "testcase", name=str(g.get("name")),
                                 classname=f"toolfid.{run.label}", file=str(run.source))
            value, thr = g.get("value"), g.get("threshold")
            text = f"{g.get('name')} = {value if value is not None else 'n/a'} (limit {g.get('op')} {thr})"
            if g.get("note"):
                text += f"; {g['note']}"
            if g.get("passed") is False:
                ET.SubElement(case, "failure", message=text, type="GateFailed").text = text
                s_fail += 1
            elif g.get("passed") is None:
                ET.SubElement(case, "skipped", message=text).text = text
                s_skip += 1
            else:
                ET.SubElement(case, "system-out").text = text
        for note in verdict.get("notes") or []:
            ET.SubElement(suite, "system-out").text = str(note)
        suite.set("tests", str(len(gates)))
        suite.set("failures", str(s_fail))
        suite.set("skipped", str(s_skip))
        suite.set("errors", "0")
        total, failures, skipped = total + len(gates), failures + s_fail, skipped + s_skip
    suites.set("tests", str(total))
    suites.set("failures", str(failures))
    suites.set("skipped", str(skipped))
    suites.set("errors", "0")
    ET.indent(suites)
    return b'<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="utf-8") + b"\n"


def write_junit(runs: list[Run], path: str | Path) -> Path:
    return atomic_write_bytes(path, junit_xml(runs))


def gate_runs(runs: list[Run], junit: str | None, stream: Any = None) -> int:
    """The gate's exit code for ``runs``, its summary lines (results: on stdout, or ``stream``), and ``junit``
    (JUnit XML) where given, said on stderr (``toolfid gate``, ``toolfid run --gate/--junit``)."""
    code = exit_code(runs)
    for line in summary_lines(runs):
        print(line, file=stream or sys.stdout)
    if junit:
        write_junit(runs, junit)
        print(f"wrote {junit}", file=sys.stderr)
    return code
