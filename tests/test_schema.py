"""Validation with full JSON Schema — including what the original design's checker missed."""

import pytest

from lm_eval_toolfid.core.schema import check_tool_schema, normalize_schema, validate_arguments

PARAMS = {
    "type": "object",
    "properties": {
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
        "ids": {"type": "array", "items": {"type": "integer"}},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
    },
    "required": ["unit"],
}


@pytest.mark.parametrize("args,keyword", [
    ({"unit": "kelvin"}, "enum"),                       # enum violation
    ({"unit": "celsius", "where": {}}, "required"),     # nested required
    ({"unit": "celsius", "where": {"lat": "north"}}, "type"),  # nested type
    ({"unit": "celsius", "ids": [1, "two"]}, "type"),   # array item type
    ({"unit": "celsius", "count": 2.5}, "type"),        # integer vs number
    ({"unit": "celsius", "count": True}, "type"),       # bool is not an integer
    ({"unit": "celsius", "flag": "yes"}, "type"),
    ({}, "required"),
])
def test_violations_are_reported_by_keyword(args, keyword):
    violation = validate_arguments(args, PARAMS)
    assert violation is not None
    assert violation.keyword == keyword


def test_valid_arguments_pass():
    assert validate_arguments({"unit": "celsius", "where": {"lat": 1}, "ids": [1, 2], "count": 3, "ratio": 3,
                               "flag": False}, PARAMS) is None


def test_violation_names_the_path():
    violation = validate_arguments({"unit": "celsius", "where": {"lat": "x"}}, PARAMS)
    assert violation.path == "where/lat"


def test_bfcl_type_names_map_to_json_schema():
    bfcl = {"type": "dict", "properties": {"x": {"type": "float"}, "t": {"type": "tuple", "items": {"type": "any"}},
                                           "o": {"type": "any"}}, "required": ["x"]}
    norm = normalize_schema(bfcl)
    assert norm["type"] == "object"
    assert norm["properties"]["x"]["type"] == "number"
    assert norm["properties"]["t"]["type"] == "array"
    assert "type" not in norm["properties"]["t"]["items"] and "type" not in norm["properties"]["o"]
    assert validate_arguments({"x": 1.5, "t": [1, "a"], "o": None}, bfcl) is None
    assert validate_arguments({"x": "1.5"}, bfcl).keyword == "type"


def test_remote_refs_are_never_fetched():
    params = {"type": "object", "properties": {"a": {"$ref": "https://example.invalid/schema.json"}}}
    violation = validate_arguments({"a": 1}, params)
    assert violation is not None and violation.keyword == "schema_unresolvable"


def test_local_refs_work():
    params = {"type": "object", "$defs": {"pos": {"type": "integer", "minimum": 0}},
              "properties": {"n": {"$ref": "#/$defs/pos"}}}
    assert validate_arguments({"n": 3}, params) is None
    assert validate_arguments({"n": -1}, params).keyword == "minimum"


def test_invalid_schemas_are_described():
    assert check_tool_schema({"type": "object", "properties": {"a": {"type": "strin"}}}) is not None
    assert check_tool_schema("nope") is not None
    assert check_tool_schema({"type": "object"}) is None


def test_fast_path_never_calls_an_invalid_call_valid() -> None:
    """The compiled fast path may only say "certainly valid" where jsonschema finds no error."""
    import random

    from jsonschema import Draft202012Validator

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.core.schema import _canonical_of, normalize_schema
    from lm_eval_toolfid.core.schema_fast import certainly_valid

    rng = random.Random(0)
    odd = [None, True, False, 0, 1, -1, 1.0, 1.5, float("nan"), "", "x", "2026-01-01", [], [1], ["a"], {},
           {"a": 1}, 10**30, "economy", 18, 99, 100]

    def mutate(value, depth=0):
        r = rng.random()
        if r < 0.25 or depth > 3:
            return rng.choice(odd)
        if isinstance(value, dict):
            out = dict(value)
            if out and rng.random() < 0.3:
                out.pop(rng.choice(list(out)))
            if rng.random() < 0.3:
                out[rng.choice(["zz", "extra", "name"])] = rng.choice(odd)
            for k in list(out):
                if rng.random() < 0.4:
                    out[k] = mutate(out[k], depth + 1)
            return out
        if isinstance(value, list):
            return [mutate(v, depth + 1) for v in value] + ([rng.choice(odd)] if rng.random() < 0.3 else [])
        return value if r < 0.5 else rng.choice(odd)

    fast_valid = checked = 0
    for case in load_cases("default"):
        for tool in case.tools:
            validator = Draft202012Validator(normalize_schema(tool.parameters))
            canonical = _canonical_of(tool.parameters)
            base = case.gold_arguments if tool.name == case.gold_tool_name else {}
            for _ in range(12):
                args = mutate(base)
                if not isinstance(args, dict):
                    continue
                checked += 1
                if certainly_valid(canonical, args):
                    fast_valid += 1
                    assert validator.is_valid(args), (case.id, tool.name, args)
    assert checked > 2000 and fast_valid > 200, (checked, fast_valid)
