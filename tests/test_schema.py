"""Validation with full JSON Schema — including what the original design's checker missed."""

import pytest

from lm_eval_toolfid.schema import check_tool_schema, normalize_schema, validate_arguments

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
