"""Loading case files (JSONL) into validated :class:`Case` records.

Every problem is reported as one line naming ``file:line``; nothing half-loads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import ValidationError

from .bundled import default_cases_path, fixture_cases_path
from .errors import ToolfidError
from .records import Case
from .schema import check_tool_schema

DEFAULT_CASES = "default"
FIXTURE_CASES = "fixture"


def resolve_cases_path(spec: str | Path | None) -> Path:
    """``None``/"default" → bundled default set; "fixture" → the fixture model's cases."""
    if spec is None or str(spec) == DEFAULT_CASES:
        return default_cases_path()
    if str(spec) == FIXTURE_CASES:
        return fixture_cases_path()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ToolfidError(f"case file not found: {path}")
    return path


def _pydantic_message(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"


def parse_case_line(line: str, where: str) -> Case:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ToolfidError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(raw, dict):
        raise ToolfidError(f"{where}: a case must be a JSON object, got {type(raw).__name__}")
    try:
        case = Case.model_validate(raw)
    except ValidationError as exc:
        raise ToolfidError(f"{where}: {_pydantic_message(exc)}") from None
    for tool in case.tools:
        problem = check_tool_schema(tool.parameters)
        if problem:
            raise ToolfidError(f"{where}: tool {tool.name!r}: parameters is not a valid JSON Schema: {problem}")
    return case


def load_cases(spec: str | Path | None = None) -> list[Case]:
    """Load and validate a case file; raises :class:`ToolfidError` with ``file:line``."""
    path = resolve_cases_path(spec)
    cases: list[Case] = []
    seen: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolfidError(f"cannot read case file {path}: {exc}") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        where = f"{path}:{lineno}"
        case = parse_case_line(line, where)
        if case.id in seen:
            raise ToolfidError(f"{where}: duplicate case id {case.id!r} (first on line {seen[case.id]})")
        seen[case.id] = lineno
        cases.append(case)
    if not cases:
        raise ToolfidError(f"{path}: no cases in file")
    return cases


def case_set_hash(cases: list[Case]) -> str:
    """Content hash of a case set (order-sensitive, formatting-insensitive)."""
    h = hashlib.sha256()
    for case in cases:
        h.update(json.dumps(case.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]
