"""The bundled default case set (``lm_eval_toolfid/cases/default_cases.jsonl``) meets its spec.

Numbered requirements (the generator is ``lm_eval_toolfid.cases.generate``, its vocabulary
``lm_eval_toolfid/cases/vocab/``). Single-turn cases (1-6 hold for them):
1. >= 220 cases, >= 45 distinct snake_case tool names, varied domains, no reserved demo names.
2. >= 35% of cases offer 2-5 tools; the rest offer 1; never more than 5.
3. Each schema feature is used by the gold tool of >= 15 cases.
4. ``gold_arguments`` validate and every string/number leaf can be read off the prompt
   (enum-constrained values excepted); optional fields are sometimes given, sometimes not.
5. Prompts are distinct (across the whole set), varied and short.
6. Ids are unique ``<domain>-<4 digits>``; ``allowed_tools`` lists exactly the tools offered.
Multi-turn cases (a history after the prompt), after the single-turn ones:
7. >= 80 cases, ids ``mt-<domain>-<4 digits>`` in >= 8 domains; depths 2, 3 and 4 and the four kinds
   (``category``: mt_follow_up, mt_retry, mt_second_tool, mt_answer) each >= 15 cases, every kind at
   every depth; 15-35% expect no call.
8. Each kind has its shape: a follow-up answers a user turn with a call; a retry repeats the last
   call's tool after an error result; a second tool differs from the last call and follows its
   result; an answer expects no call.
9. Every history call and gold call validates; every gold string/number leaf can be read off the
   prompt, a user turn or a tool result; >= 90% of follow-ups need a value only a tool result holds.
10. The tools offered are the tools the conversation calls, the expected one, and distractors (<= 5).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lm_eval_toolfid.cases import generate
from lm_eval_toolfid.cases.bundled import default_cases_path
from lm_eval_toolfid.cases.set_stats import stats_markdown
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.core.schema import validate_arguments

ROOT = Path(__file__).resolve().parent.parent
RESERVED = {"convert_currency", "set_alarm", "cancel_alarm", "translate_text", "list_files", "delete_file"}
SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
CASE_ID = re.compile(r"^([a-z]+)-(\d{4})$")
MT_ID = re.compile(r"^mt-([a-z]+)-(\d{4})$")
KINDS = ("mt_follow_up", "mt_retry", "mt_second_tool", "mt_answer")
MAX_PROMPT_CHARS = 300


@pytest.fixture(scope="module")
def all_cases() -> list[Case]:
    return load_cases("default")


@pytest.fixture(scope="module")
def cases(all_cases: list[Case]) -> list[Case]:
    """The single-turn cases (all before the first multi-turn one)."""
    single = [c for c in all_cases if not c.history]
    assert all_cases[:len(single)] == single
    return single


@pytest.fixture(scope="module")
def conversations(all_cases: list[Case]) -> list[Case]:
    return [c for c in all_cases if c.history]


# --------------------------------------------------------------------------- helpers


def schema_features(params: dict[str, Any]) -> set[str]:
    """Which schema features a tool's ``parameters`` uses (recursively)."""
    found: set[str] = set()
    root_props = params.get("properties", {})
    root_required = params.get("required", [])
    if root_required:
        found.add("required_list")
    if set(root_props) - set(root_required):
        found.add("optional_fields")

    def walk(node: Any, depth: int) -> None:
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if "enum" in node and all(isinstance(v, str) for v in node["enum"]):
            found.add("enum")
        if kind in ("integer", "number", "boolean"):
            found.add(kind)
        if kind == "object":
            if depth > 0 and node.get("properties") and "required" in node:
                found.add("nested_object")
            for sub in node.get("properties", {}).values():
                walk(sub, depth + 1)
        if kind == "array":
            items = node.get("items")
            if isinstance(items, dict) and items.get("type") in ("string", "integer", "object"):
                found.add(f"array_of_{items['type']}s")
            walk(items, depth + 1)

    walk(params, 0)
    return found


def appears_as_number(value: int | float, text: str) -> bool:
    """``value`` is written in ``text`` as JSON writes it, not inside a longer number."""
    literal = json.dumps(value)
    return re.search(r"(?<![\d.])" + re.escape(literal) + r"(?!\d|\.\d)", text) is not None


def missing_leaves(value: Any, schema: dict[str, Any], prompt: str, path: str = "") -> list[str]:
    """String/number leaves of ``value`` not recoverable from ``prompt``; enum leaves are exempt."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return [m for k, v in value.items() for m in missing_leaves(v, props.get(k, {}), prompt, f"{path}/{k}")]
    if isinstance(value, list):
        items = schema.get("items", {})
        return [m for i, v in enumerate(value) for m in missing_leaves(v, items, prompt, f"{path}/{i}")]
    if "enum" in schema or isinstance(value, bool):
        return []
    if isinstance(value, str):
        return [] if value in prompt else [f"{path}={value!r}"]
    if isinstance(value, (int, float)):
        return [] if appears_as_number(value, prompt) else [f"{path}={value!r}"]
    return [f"{path}: unexpected {type(value).__name__}"]


def leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    return [value]


# --------------------------------------------------------------------------- the helpers can fail


def test_helpers_detect_problems() -> None:
    params = {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}
    assert missing_leaves({"city": "Paris", "days": 3, "unit": "celsius"}, params,
                          "Weather in Paris for 3 days, in Celsius") == []
    assert missing_leaves({"city": "Paris"}, params, "Weather in paris") == ["/city='Paris'"]
    assert missing_leaves({"city": "Oslo", "days": 3}, params, "Oslo on 2026-03-14") == ["/days=3"]
    assert not appears_as_number(12.5, "costs 112.55")
    assert appears_as_number(12.5, "costs 12.5 euros")
    assert schema_features(params) == {"required_list", "optional_fields", "enum", "integer"}
    nested = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                               "to": {"type": "object", "properties": {"x": {"type": "number"}},
                                                      "required": ["x"]}}, "required": ["tags", "to"]}
    assert schema_features(nested) == {"required_list", "array_of_strings", "nested_object", "number"}


# --------------------------------------------------------------------------- 1. size and variety


def test_case_count_and_distinct_tools(cases: list[Case]) -> None:
    assert len(cases) >= 220
    offered = {t.name for c in cases for t in c.tools}
    gold = {c.gold_tool_name for c in cases}
    assert len(offered) >= 45
    assert len(gold) >= 45


def test_tool_names_snake_case_and_not_reserved(all_cases: list[Case]) -> None:
    names = {t.name for c in all_cases for t in c.tools}
    assert not [n for n in names if not SNAKE.match(n)]
    assert not names & RESERVED


def test_tools_have_descriptions_and_one_spec_per_name(all_cases: list[Case]) -> None:
    specs: dict[str, str] = {}
    for c in all_cases:
        for t in c.tools:
            assert len(t.description) >= 10, t.name
            blob = json.dumps(t.for_prompt(), sort_keys=True)
            assert specs.setdefault(t.name, blob) == blob, f"{t.name} has two different specs"


def test_domains_are_varied(cases: list[Case]) -> None:
    domains = Counter(CASE_ID.match(c.id).group(1) for c in cases)  # type: ignore[union-attr]
    assert len(domains) >= 12
    assert max(domains.values()) <= 0.15 * len(cases)


# --------------------------------------------------------------------------- 2. tools offered


def test_multi_tool_share(cases: list[Case]) -> None:
    sizes = Counter(len(c.tools) for c in cases)
    assert set(sizes) <= {1, 2, 3, 4, 5}
    multi = sum(v for k, v in sizes.items() if k >= 2)
    assert multi / len(cases) >= 0.35
    assert {2, 3, 4, 5} <= set(sizes), "every size 2-5 should occur"


def test_allowed_tools_are_the_offered_tools(all_cases: list[Case]) -> None:
    for c in all_cases:
        assert c.allowed_tools == c.tool_names, c.id
        assert c.gold_tool_name in c.tool_names or (c.history and c.gold_tool_name is None), c.id


# --------------------------------------------------------------------------- 3. schema features

FEATURES = ["enum", "nested_object", "array_of_strings", "array_of_integers", "array_of_objects", "integer",
            "number", "boolean", "optional_fields", "required_list"]


@pytest.fixture(scope="module")
def feature_counts(cases: list[Case]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for c in cases:
        counts.update(schema_features(c.gold_tool.parameters))
    return counts


@pytest.mark.parametrize("feature", FEATURES)
def test_schema_feature_in_15_gold_tools(feature: str, feature_counts: Counter[str]) -> None:
    assert feature_counts[feature] >= 15, f"{feature}: {feature_counts[feature]} cases"


# --------------------------------------------------------------------------- 4. gold arguments


def test_gold_arguments_validate(cases: list[Case]) -> None:
    bad = []
    for c in cases:
        assert c.gold_arguments is not None, c.id
        violation = validate_arguments(c.gold_arguments, c.gold_tool.parameters)
        if violation is not None:
            bad.append(f"{c.id}: {violation.keyword} at {violation.path}: {violation.message}")
    assert not bad, "\n".join(bad)


def test_gold_argument_values_recoverable_from_prompt(cases: list[Case]) -> None:
    bad = [f"{c.id}: {m}" for c in cases
           for m in missing_leaves(c.gold_arguments, c.gold_tool.parameters, c.prompt)]
    assert not bad, "\n".join(bad)


def test_optional_fields_sometimes_given_sometimes_not(cases: list[Case]) -> None:
    with_optional = given = 0
    for c in cases:
        params = c.gold_tool.parameters
        optional = set(params.get("properties", {})) - set(params.get("required", []))
        if optional:
            with_optional += 1
            given += bool(optional & set(c.gold_arguments or {}))
    assert with_optional >= 100
    assert 0.2 <= given / with_optional <= 0.9


def test_both_boolean_values_occur(cases: list[Case]) -> None:
    bools = Counter(x for c in cases for x in leaves(c.gold_arguments) if isinstance(x, bool))
    assert bools[True] >= 15 and bools[False] >= 5


# --------------------------------------------------------------------------- 5. prompts


def test_prompts_distinct_short_and_varied(cases: list[Case], all_cases: list[Case]) -> None:
    prompts = [c.prompt for c in all_cases]
    assert len(set(prompts)) == len(prompts)
    assert max(map(len, prompts)) <= MAX_PROMPT_CHARS
    prompts = [c.prompt for c in cases]
    assert max(map(len, prompts)) <= MAX_PROMPT_CHARS
    openings = {" ".join(p.split()[:3]) for p in prompts}
    assert len(openings) >= len(cases) // 3
    by_tool: dict[str, set[str]] = {}
    for c in cases:
        by_tool.setdefault(c.gold_tool_name, set()).add(" ".join(c.prompt.split()[:2]))
    assert sum(len(v) >= 2 for v in by_tool.values()) >= 0.8 * len(by_tool)


# --------------------------------------------------------------------------- 6. ids


def test_ids_unique_and_formatted(cases: list[Case], conversations: list[Case], all_cases: list[Case]) -> None:
    ids = [c.id for c in all_cases]
    assert len(set(ids)) == len(ids)
    assert all(CASE_ID.match(c.id) for c in cases)
    assert all(MT_ID.match(c.id) for c in conversations)


# --------------------------------------------------------------------------- 7. multi-turn: size and coverage


def test_multi_turn_counts_per_depth_kind_and_domain(conversations: list[Case]) -> None:
    assert len(conversations) >= 80
    assert len({MT_ID.match(c.id).group(1) for c in conversations}) >= 8  # type: ignore[union-attr]
    depths = Counter(c.turn_depth for c in conversations)
    kinds = Counter(c.category for c in conversations)
    assert set(depths) == {2, 3, 4} and min(depths.values()) >= 15, depths
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 15, kinds
    assert {(c.category, c.turn_depth) for c in conversations} == {(k, d) for k in KINDS for d in (2, 3, 4)}
    no_call = sum(c.gold_tool_name is None for c in conversations) / len(conversations)
    assert 0.15 <= no_call <= 0.35


# --------------------------------------------------------------------------- 8. multi-turn: the kinds' shapes


def calls_of(case: Case) -> list[Any]:
    return [call for m in case.history for call in m.tool_calls or []]


def test_each_kind_has_its_shape(conversations: list[Case]) -> None:
    corrected = retries = 0
    for c in conversations:
        last, last_call = c.history[-1], calls_of(c)[-1]
        results = [json.loads(m.content or "") for m in c.history if m.role == "tool"]
        if c.category == "mt_answer":
            assert c.gold_tool_name is None and c.irrelevant, c.id
            assert "error" not in results[-1], c.id
            continue
        assert c.gold_tool_name is not None and c.gold_arguments is not None, c.id
        if c.category == "mt_follow_up":
            assert last.role == "user", c.id
        elif c.category == "mt_retry":
            assert "error" in results[-1] and c.gold_tool_name == last_call.name, c.id
            retries += 1
            corrected += c.gold_arguments != last_call.arguments
        else:
            assert c.category == "mt_second_tool", c.id
            assert last.role == "tool" and "error" not in results[-1], c.id
            assert c.gold_tool_name != last_call.name, c.id
    assert corrected >= 0.6 * retries  # most retries change an argument (the rest retry a transient failure)


# --------------------------------------------------------------------------- 9. multi-turn: values


def said_and_results(case: Case) -> tuple[str, str]:
    said = "\n".join([case.prompt] + [m.content or "" for m in case.history if m.role == "user"])
    return said, "\n".join(m.content or "" for m in case.history if m.role == "tool")


def test_multi_turn_calls_validate_and_gold_values_are_findable(conversations: list[Case]) -> None:
    bad = []
    for c in conversations:
        for call in calls_of(c):
            violation = validate_arguments(call.arguments, c.tool(call.name).parameters)  # type: ignore[union-attr]
            if violation is not None:
                bad.append(f"{c.id}: history call {call.name}: {violation.message}")
        if c.gold_tool is None:
            continue
        violation = validate_arguments(c.gold_arguments or {}, c.gold_tool.parameters)
        if violation is not None:
            bad.append(f"{c.id}: gold: {violation.message}")
        said, results = said_and_results(c)
        bad += [f"{c.id}: {m}" for m in missing_leaves(c.gold_arguments, c.gold_tool.parameters, f"{said}\n{results}")]
    assert not bad, "\n".join(bad)


def test_follow_ups_need_a_value_only_a_tool_result_holds(conversations: list[Case]) -> None:
    def result_only(c: Case) -> set[str]:
        said, results = said_and_results(c)
        schema = c.gold_tool.parameters  # type: ignore[union-attr]
        return set(missing_leaves(c.gold_arguments, schema, said)) - set(missing_leaves(c.gold_arguments, schema,
                                                                                            f"{said}\n{results}"))

    with_gold = [c for c in conversations if c.gold_tool is not None]
    grounded = Counter(c.category for c in with_gold if result_only(c))
    follow_ups = sum(c.category == "mt_follow_up" for c in conversations)
    assert grounded["mt_follow_up"] >= 0.9 * follow_ups
    assert grounded["mt_retry"] >= 5 and grounded["mt_second_tool"] >= 5


# --------------------------------------------------------------------------- 10. multi-turn: tools offered


def test_multi_turn_offers_the_conversations_tools_and_distractors(conversations: list[Case]) -> None:
    with_distractors = 0
    for c in conversations:
        needed = {call.name for call in calls_of(c)} | ({c.gold_tool_name} - {None})
        assert needed <= set(c.tool_names) and len(c.tools) <= 5, c.id
        with_distractors += len(c.tools) > len(needed)
    assert 0.25 <= with_distractors / len(conversations) <= 0.75


# --------------------------------------------------------------------------- the file is the script's output


def test_shipped_file_matches_generator() -> None:
    regenerated = generate.build_cases(random.Random(generate.SEED))
    generate.check(regenerated)
    expected = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in regenerated)
    assert default_cases_path().read_text(encoding="utf-8") == expected, \
        "default_cases.jsonl is stale: re-run scripts/make_default_cases.py"
    stats = (ROOT / "lm_eval_toolfid" / "cases" / "default_cases_stats.md").read_text(encoding="utf-8")
    assert stats == stats_markdown(regenerated)
