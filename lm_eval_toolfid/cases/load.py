"""Loading case files (JSONL) into validated :class:`Case` records.

Every problem is reported as one line naming ``file:line``; nothing half-loads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import ValidationError

from lm_eval_toolfid.cases.bundled import default_cases_path, fixture_cases_path
from lm_eval_toolfid.cases.limits import check_field_sizes, check_line_size
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.core.schema import check_tool_schema

DEFAULT_CASES = "default"
FIXTURE_CASES = "fixture"


def resolve_cases_path(spec: str | Path | None) -> Path:
    """``None``/"default" → bundled default set; "fixture" → the fixture model's cases."""
    if spec is None or str(spec) == DEFAULT_CASES:
        return default_cases_path()
    if str(spec) == FIXTURE_CASES:
        return fixture_cases_path()
    path = Path(spec).expanduser()
    if path.is_dir():
        raise ToolfidError(f"case file {path} is a directory; give the .jsonl file")
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
    check_line_size(line, where)
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ToolfidError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); "
                           f"each line must be one complete JSON object") from None
    except RecursionError:
        raise ToolfidError(f"{where}: JSON nests too deeply to load; flatten this case") from None
    if not isinstance(raw, dict):
        raise ToolfidError(f"{where}: a case must be a JSON object, got {type(raw).__name__}")
    check_field_sizes(raw, where)
    try:
        case = Case.model_validate(raw)
    except ValidationError as exc:
        raise ToolfidError(f"{where}: {_pydantic_message(exc)}") from None
    for tool in case.tools:
        problem = check_tool_schema(tool.parameters)
        if problem:
            raise ToolfidError(f"{where}: tool {tool.name!r}: parameters is not a valid JSON Schema: {problem}")
    return case


def _lines(text: str) -> list[str]:
    """JSONL lines. Only ``\n`` ends a line: ``str.splitlines`` would also split on U+2028/U+2029/
    U+0085 and friends, which JSON allows raw inside strings."""
    lines = text.split("\n")
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_PARSED: dict[tuple[str, str], tuple[Case, ...]] = {}
"""Case files already parsed in this process, by path and content digest (a run builds the task once per view: a
hundred views read the file a hundred times, and parse it once). Cases are frozen records."""


def load_cases(spec: str | Path | None = None) -> list[Case]:
    """Load and validate a case file; raises :class:`ToolfidError` with ``file:line``."""
    path = resolve_cases_path(spec)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ToolfidError(f"cannot read case file {path}: {exc.strerror or exc}") from None
    key = (str(path), hashlib.sha256(data).hexdigest())
    parsed = _PARSED.get(key)
    if parsed is None:
        parsed = tuple(_parse_cases(path, data))
        if len(_PARSED) >= 16:
            _PARSED.clear()
        _PARSED[key] = parsed
    return list(parsed)


def _parse_cases(path: Path, data: bytes) -> list[Case]:
    cases: list[Case] = []
    seen: dict[str, int] = {}
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark at the start is tolerated
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ToolfidError(f"{path}:{line}: not UTF-8 (byte {exc.start}); save the case file as UTF-8") from None
    for lineno, line in enumerate(_lines(text), start=1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        where = f"{path}:{lineno}"
        case = parse_case_line(line, where)
        if case.id in seen:
            raise ToolfidError(f"{where}: duplicate case id {case.id!r} (first on line {seen[case.id]})")
        seen[case.id] = lineno
        cases.append(case)
    if not cases:
        raise ToolfidError(f"{path}: no cases in file (empty, or only blank/comment lines); "
                           f"write one JSON case object per line")
    return cases


_SET_HASHES: dict[tuple[int, ...], tuple[list[Case], str]] = {}
"""The ids of a case list's (frozen) cases -> (the list, held so the ids stay theirs; its hash): every view of a run
hashes the same loaded cases."""


def case_set_hash(cases: list[Case]) -> str:
    """Content hash of a case set (order-sensitive, formatting-insensitive). A single-turn case hashes as
    it did before cases could carry a history (an empty history is left out), so references and
    calibrations made for single-turn case sets still pair."""
    key = tuple(map(id, cases))
    held = _SET_HASHES.get(key)
    if held is None:
        if len(_SET_HASHES) > 32:
            _SET_HASHES.clear()
        held = _SET_HASHES[key] = (list(cases), _case_set_hash(cases))
    return held[1]


def _case_set_hash(cases: list[Case]) -> str:
    h = hashlib.sha256()
    for case in cases:
        data = case.model_dump(mode="json", exclude=set() if case.history else {"history"})
        h.update(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]
