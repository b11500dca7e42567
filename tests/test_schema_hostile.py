"""Hostile tool schemas: remote $ref, catastrophic patterns, recursion, formats, broken schemas.

Everything runs through the real ``jsonschema`` validator (and RE2 / Python ``re``); the
remote-ref tests run a real HTTP server on loopback and count its hits.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest

from lm_eval_toolfid.core import schema as S
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import OutcomeKind
from lm_eval_toolfid.core.schema import check_tool_schema, validate_arguments
from lm_eval_toolfid.scoring.outcome import score_generation
from tests.conftest import REPO, make_case

EVIL = "a" * 40 + "!"
BACKTRACKING_ONLY = r"^(?=a)(a+)+$"  # lookahead: RE2 refuses it, so it runs on Python re (budgeted)


# --- remote $ref: never fetched ---------------------------------------------------------------

@pytest.fixture()
def loopback():
    """A real HTTP server on 127.0.0.1 that serves a schema for any path and counts requests."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            hits.append(self.path)
            body = json.dumps({"type": "string", "$defs": {"y": {"type": "string"}}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for the loop to look at its flag: every 0.05 s, not every 0.5 s (the default)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def remote_schemas(url: str) -> list[dict]:
    return [
        {"type": "object", "properties": {"a": {"$ref": f"{url}/x.json"}}},                       # absolute
        {"$id": f"{url}/root.json", "type": "object", "properties": {"a": {"$ref": "x.json"}}},   # $id-relative
        {"$id": f"{url}/root.json", "properties": {"a": {"$ref": "other.json#/$defs/y"}}},       # + fragment
        {"properties": {"a": {"$id": f"{url}/sub/", "$ref": "x.json"}}},                         # nested $id
        {"$id": f"{url}/root.json", "properties": {"a": {"$dynamicRef": "x.json#meta"}}},        # $dynamicRef
        {"$id": f"{url}/root.json", "properties": {"a": {"$ref": "/x.json"}}},                   # root-relative
    ]


def test_remote_refs_are_never_fetched(loopback):
    url, hits = loopback
    for params in remote_schemas(url):
        violation = validate_arguments({"a": "hello"}, params)
        assert violation is not None and violation.keyword == "schema_unresolvable", params
        problem = check_tool_schema(params)
        assert problem is not None and "$ref" in problem, params
    assert hits == []
    # the server was reachable all along, so zero hits means "not fetched", not "could not connect"
    with urllib.request.urlopen(f"{url}/x.json", timeout=5) as resp:
        assert json.loads(resp.read())["type"] == "string"
    assert hits == ["/x.json"]


def test_embedded_id_resources_still_resolve(loopback):
    url, hits = loopback
    params = {"$id": f"{url}/root.json", "$defs": {"x": {"$id": "x.json", "type": "string"}},
              "properties": {"a": {"$ref": "x.json"}, "b": {"$ref": "#/$defs/x"}}}
    assert check_tool_schema(params) is None
    assert validate_arguments({"a": "s", "b": "t"}, params) is None
    assert validate_arguments({"a": 1}, params).keyword == "type"
    # the JSON Schema meta-schemas ship with jsonschema, so refs to them resolve offline
    meta = {"type": "object", "properties": {"s": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}}
    assert check_tool_schema(meta) is None
    assert validate_arguments({"s": {"type": "string"}}, meta) is None
    assert validate_arguments({"s": {"type": 3}}, meta) is not None
    assert hits == []


def write_cases(tmp_path, *cases):
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def case_with(params, case_id="c"):
    return {"id": case_id, "prompt": "p", "gold_tool_name": "t", "tools": [{"name": "t", "parameters": params}]}


def test_cases_with_unresolvable_refs_are_rejected_at_load(tmp_path, loopback):
    url, hits = loopback
    good = case_with({"type": "object"}, "ok")
    remote = case_with({"$id": f"{url}/root.json", "properties": {"a": {"$ref": "x.json"}}})
    path = write_cases(tmp_path, good, remote)
    with pytest.raises(ToolfidError) as err:
        load_cases(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:2: tool 't'") and "'x.json'" in msg and f"{url}/x.json" in msg
    assert "never fetched" in msg and "\n" not in msg
    missing = case_with({"$defs": {"y": {}}, "properties": {"a": {"$ref": "#/$defs/x"}}})
    path = write_cases(tmp_path, good, good | {"id": "ok2"}, missing)
    with pytest.raises(ToolfidError, match=r"cases\.jsonl:3: .*'#/\$defs/x' points to nothing"):
        load_cases(path)
    assert hits == []


# --- patterns: bounded time, own keyword -----------------------------------------------------

@pytest.fixture()
def short_budget(monkeypatch):
    """A 0.1 s pattern budget instead of 0.5 s where a test waits for it to run out (EVIL never matches within
    either: ~2^40 steps); the per-string check (50 strings x 0.1 s = 5 s) still exceeds the budget + 2 s bound."""
    monkeypatch.setattr(S, "PATTERN_BUDGET_S", 0.1)


def timed(args, params):
    start = time.monotonic()
    violation = validate_arguments(args, params)
    return violation, time.monotonic() - start


def test_jsonschema_pattern_matching_is_routed_through_toolfid():
    # if a jsonschema release stops matching through its module-level ``re``, fail here, not by hanging below
    assert jsonschema._keywords.re is S._GUARDED_RE and jsonschema._utils.re is S._GUARDED_RE


def test_catastrophic_pattern_runs_in_linear_time_on_re2():
    assert S.HAVE_RE2, "google-re2 is a declared dependency"
    violation, took = timed({"s": EVIL}, {"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})
    assert violation.keyword == "pattern" and violation.path == "s"
    assert took < S.PATTERN_BUDGET_S  # Python re would need ~2^40 steps here
    assert validate_arguments({"s": "a" * 40}, {"properties": {"s": {"pattern": "^(a+)+$"}}}) is None


@pytest.mark.parametrize("params,args", [
    ({"properties": {"s": {"type": "string", "pattern": BACKTRACKING_ONLY}}}, {"s": EVIL}),
    ({"patternProperties": {BACKTRACKING_ONLY: {"type": "string"}}}, {EVIL: 1}),
    ({"patternProperties": {"^x$": {}, BACKTRACKING_ONLY: {}}, "additionalProperties": False}, {EVIL: 1}),
    ({"patternProperties": {BACKTRACKING_ONLY: {}}, "unevaluatedProperties": False}, {EVIL: 1}),
    ({"propertyNames": {"pattern": BACKTRACKING_ONLY}}, {EVIL: 1}),
    ({"properties": {"l": {"type": "array", "items": {"pattern": BACKTRACKING_ONLY}}}}, {"l": [EVIL] * 50}),
])
@pytest.mark.usefixtures("short_budget")
def test_backtracking_patterns_time_out_with_their_own_keyword(params, args):
    violation, took = timed(args, params)
    assert violation is not None and violation.keyword == "pattern_timeout"
    assert BACKTRACKING_ONLY in violation.message
    assert took < S.PATTERN_BUDGET_S + 2.0  # one budget per validation, not per string


def test_backtracking_patterns_still_work_when_they_finish():
    params = {"properties": {"s": {"type": "string", "pattern": r"^(?!admin)\w+$"}}}
    assert validate_arguments({"s": "alice"}, params) is None
    assert validate_arguments({"s": "admin1"}, params).keyword == "pattern"
    assert validate_arguments({"s": "aaaa"}, {"properties": {"s": {"pattern": BACKTRACKING_ONLY}}}) is None


@pytest.mark.usefixtures("short_budget")
def test_without_re2_every_pattern_is_budgeted(monkeypatch):
    monkeypatch.setattr(S, "HAVE_RE2", False)
    S._compiled.cache_clear()
    try:
        violation, took = timed({"s": EVIL}, {"properties": {"s": {"pattern": "^(a+)+$"}}})
        assert violation.keyword == "pattern_timeout" and took < S.PATTERN_BUDGET_S + 2.0
        assert validate_arguments({"s": "aaa"}, {"properties": {"s": {"pattern": "^(a+)+$"}}}) is None
    finally:
        S._compiled.cache_clear()


def test_off_the_main_thread_backtracking_is_unsafe_not_a_hang():
    out = {}

    def work():
        out["evil"] = validate_arguments({"s": EVIL}, {"properties": {"s": {"pattern": BACKTRACKING_ONLY}}})
        out["re2"] = validate_arguments({"s": EVIL}, {"properties": {"s": {"pattern": "^(a+)+$"}}})

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert out["evil"].keyword == "pattern_unsafe"
    assert out["re2"].keyword == "pattern"  # RE2 needs no budget, so it works in any thread


@pytest.mark.usefixtures("short_budget")
def test_an_outer_alarm_timer_survives():
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    previous = signal.getsignal(signal.SIGALRM)
    try:
        assert validate_arguments({"s": EVIL}, {"properties": {"s": {"pattern": BACKTRACKING_ONLY}}}).keyword \
            == "pattern_timeout"
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < left < 30.0
        assert signal.getsignal(signal.SIGALRM) is previous
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_re2_follows_ecma_262_where_python_re_does_not():
    # ECMA-262 (what JSON Schema specifies): '$' does not match before a final newline, \d is ASCII
    assert validate_arguments({"s": "abc\n"}, {"properties": {"s": {"pattern": "^abc$"}}}).keyword == "pattern"
    assert validate_arguments({"s": "\u0663"}, {"properties": {"s": {"pattern": r"^\d$"}}}).keyword == "pattern"
    # and jsonschema used elsewhere in the process keeps plain Python re semantics
    assert jsonschema.Draft202012Validator({"pattern": "^abc$"}).is_valid("abc\n")


@pytest.mark.usefixtures("short_budget")
def test_pattern_timeout_reaches_the_outcome():
    case = make_case(tools=[{"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "pattern": BACKTRACKING_ONLY}}}}])
    outcome = score_generation(json.dumps({"name": "get_weather", "arguments": {"city": EVIL}}), case)
    assert outcome.kind == OutcomeKind.SCHEMA_ERROR and outcome.keyword == "pattern_timeout"


# --- recursion, broken schemas, unexpected failures --------------------------------------------

TREE = {"$defs": {"node": {"type": "object", "required": ["v"], "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}


def tree(depth, leaf=1):
    node = {"v": leaf}
    for _ in range(depth):
        node = {"v": 0, "kids": [node, {"v": 2}]}
    return node


def test_recursive_refs_validate_deep_finite_arguments():
    assert check_tool_schema(TREE) is None
    assert validate_arguments(tree(40), TREE) is None
    violation = validate_arguments(tree(40, leaf="x"), TREE)
    assert violation.keyword == "type" and violation.path == "/".join(["kids/0"] * 40 + ["v"])


def test_absurd_depth_and_ref_cycles_are_validator_errors_not_crashes(caplog):
    S._warned.clear()
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        first = validate_arguments(tree(5000), TREE)
        second = validate_arguments(tree(6000), TREE)
    assert first.keyword == second.keyword == "validator_error"
    assert len([r for r in caplog.records if "validator_error" in r.getMessage()]) == 1  # logged once
    cycle = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert "circular" in check_tool_schema(cycle)
    assert validate_arguments({}, cycle).keyword == "validator_error"


def test_unexpected_validator_failures_are_their_own_keyword(monkeypatch, caplog):
    S._warned.clear()
    params = {"type": "object", "properties": {"n": {"type": "integer"}}}
    validator, _ = S._validator_for(S._canonical(params))

    def explode(*args, **kwargs):
        raise ValueError("boom")
        yield  # pragma: no cover

    monkeypatch.setattr(type(validator), "iter_errors", explode)
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        violation = validate_arguments({"n": "x"}, params)  # not certainly valid: jsonschema runs
    assert violation.keyword == "validator_error" and "ValueError: boom" in violation.message
    assert any("ValueError: boom" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("params,keyword", [
    ({"properties": {"a": {"minimum": "x"}}}, "schema_invalid"),
    ({"properties": {"a": {"type": "strng"}}}, "schema_invalid"),
    ({"properties": {"a": {"pattern": "(unclosed"}}}, "schema_invalid"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "schema_unresolvable"),
])
def test_broken_schemas_have_distinct_keywords(params, keyword):
    violation = validate_arguments({"a": "s"}, params)
    assert (violation.keyword if violation else None) == keyword


# --- formats -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,good,bad", [
    ("date", "2024-02-29", "2023-02-29"),
    ("date-time", "2024-02-28T10:00:00.5+01:00", "2024-02-28 10:00"),
    ("email", "ana@example.com", "ana at example.com"),
    ("uri", "https://example.com/a?b=1#c", "not a uri"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
    ("ipv4", "192.168.0.1", "256.1.1.1"),
    ("ipv6", "::1", "::g"),
])
def test_listed_formats_are_asserted(fmt, good, bad):
    params = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}}
    assert validate_arguments({"v": good}, params) is None
    violation = validate_arguments({"v": bad}, params)
    assert violation is not None and violation.keyword == "format" and violation.path == "v"


@pytest.mark.parametrize("fmt", ["hostname", "time", "regex", "duration", "phone", "uri-reference"])
def test_other_formats_are_annotations_only(fmt):
    assert validate_arguments({"v": "(( not anything"}, {"properties": {"v": {"format": fmt}}}) is None


def test_asserted_format_list_is_what_the_docs_say():
    assert set(S.FORMAT_CHECKER.checkers) == set(S.ASSERTED_FORMATS)
    text = (REPO / "docs" / "schemas.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in text for name in S.ASSERTED_FORMATS)


def test_validator_cache_is_keyed_by_the_normalised_schema():
    a = {"type": "dict", "properties": {"x": {"type": "float"}, "y": {"type": "int"}}}
    b = {"properties": {"y": {"type": "integer"}, "x": {"type": "number"}}, "type": "object"}
    assert S._canonical(a) == S._canonical(b)
    validate_arguments({"x": 1.0}, a)
    before = S._validator_for.cache_info().hits
    validate_arguments({"x": 1.0}, b)
    assert S._validator_for.cache_info().hits == before + 1
