"""The recipe language of the default set's vocabulary: steps, operators, the random stream, errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lm_eval_toolfid.cases import generate
from lm_eval_toolfid.cases.grounding import result_only_values
from lm_eval_toolfid.cases.vocabulary import load_vocab
from lm_eval_toolfid.cases.recipes import Recipe, RecipeError, Redraw, join_en
from lm_eval_toolfid.core.errors import ToolfidError

POOLS = {"cities": ["Lisbon", "Osaka", "Denver"], "units": ["celsius", "fahrenheit"],
         "modes": {"driving": "by car", "walking": "on foot"}}
SAMPLERS = {"code": {"concat": ["X-", {"digits": 3}]}}

WEATHER = [
    {"let": {"loc": {"choice": "@cities"}, "days": {"randint": [2, 9]}, "u": "", "m": "", "x": ""}},
    {"arg": {"location": "$loc", "days": "$days"}},
    {"if": {"chance": 0.5}, "then": [
        {"arg": {"units": {"choice": "@units"}}},
        {"let": {"u": " in {args[units]!c}"}}]},
    {"some": [0, 1, 2], "of": {
        "m": [{"arg": {"mode": {"choice": {"keys": "@modes"}}}},
              {"let": {"m": {"concat": [", ", {"lookup": ["@modes", "$args.mode"]}]}}}],
        "x": [{"arg": {"trip.code": {"use": "code"}}}, {"let": {"x": " ({args[trip][code]})"}}]}},
    {"say": ["{loc} for {days} days{u}{m}{x}.", "Forecast {loc}, {days} days{u}{m}{x}."]},
]


def weather_by_hand(r: random.Random) -> tuple[str, dict]:
    """WEATHER written as plain Python: the recipe must draw exactly this, in this order."""
    loc, days = r.choice(POOLS["cities"]), r.randint(2, 9)
    args: dict = {"location": loc, "days": days}
    u = m = x = ""
    if r.random() < 0.5:
        args["units"] = r.choice(POOLS["units"])
        u = f" in {args['units'].capitalize()}"
    chosen = r.sample(["m", "x"], r.choice([0, 1, 2]))
    if "m" in chosen:
        args["mode"] = r.choice(list(POOLS["modes"]))
        m = f", {POOLS['modes'][args['mode']]}"
    if "x" in chosen:
        args["trip"] = {"code": f"X-{r.randint(100, 999)}"}
        x = f" ({args['trip']['code']})"
    return r.choice(["{loc} for {days} days{u}{m}{x}.", "Forecast {loc}, {days} days{u}{m}{x}."]).format(
        loc=loc, days=days, u=u, m=m, x=x), args


def run(steps: list, seed: int = 0) -> tuple[dict, random.Random]:
    r = random.Random(seed)
    return Recipe(r, POOLS, SAMPLERS, 2026).run(steps), r


@pytest.mark.parametrize("seed", range(40))
def test_a_recipe_is_its_python_program_over_the_random_stream(seed: int) -> None:
    env, r = run(WEATHER, seed)
    by_hand = random.Random(seed)
    prompt, args = weather_by_hand(by_hand)
    assert (env["prompt"], json.dumps(env["args"])) == (prompt, json.dumps(args))
    assert r.getstate() == by_hand.getstate()


def test_say_inside_if_ends_the_recipe_and_and_skips_later_draws() -> None:
    steps = [{"let": {"n": 1}},
             {"if": {"and": [{"eq": ["$n", 2]}, {"chance": 0.5}]}, "then": [{"say": ["never"]}]},
             {"if": {"eq": ["$n", 1]}, "then": [{"arg": {"n": "$n"}}, {"say": ["early {n}"]}]},
             {"arg": {"late": True}}, {"say": ["late"]}]
    env, r = run(steps)
    assert env["prompt"] == "early 1" and env["args"] == {"n": 1}
    fresh = random.Random(0)
    fresh.choice(["early {n}"])  # the only draw: the `and` stopped before its chance
    assert r.getstate() == fresh.getstate()


def test_operators() -> None:
    steps = [{"let": {
        "pair": {"sample": {"range": [1, 50]}, "k": 2},
        "a,b": "$pair",
        "money": {"money": [20, 30]},
        "span": {"date_range": [3, 3]},
        "clock": {"clock": [9, 9]},
        "emails": {"distinct": 3, "each": {"choice": ["p", "q", "r"]}},
        "items": {"repeat": 2, "do": [{"let": {"k": {"randint": [1, 3]}}}], "yield": {"object": {"k": "$k"}}},
        "squares": {"map": [1, 2, 3], "as": "v", "yield": {"mul": ["$v", "$v"]}},
        "merged": {"add": [{"object": {"a": 1}}, {"object": {"b": 2}}]},
        "word": {"plural": [["x"], "seat", "seats"]},
        "name": {"basename": "/a/b/c.txt"},
        "rounded": {"round": [{"div": [10, 4]}, 1]},
        "cond": {"if": {"in": [3, [1, 2, 3]]}, "then": "yes", "else": "no"},
    }}, {"say": ["{a}-{b} {span[0]}"]}]
    env, _ = run(steps, 3)
    assert env["a"] == env["pair"][0] and env["b"] == env["pair"][1]
    assert isinstance(env["money"], (int, float)) and 20 <= env["money"] <= 30
    start, end = env["span"]
    assert start.startswith("2026-") and end > start
    assert env["clock"][:3] == "09:" and env["clock"][3:] in {"00", "15", "30", "45"}
    assert sorted(env["emails"]) == ["p", "q", "r"]
    assert [set(i) for i in env["items"]] == [{"k"}, {"k"}] and "k" not in env  # do-steps have their own scope
    assert env["squares"] == [1, 4, 9] and env["merged"] == {"a": 1, "b": 2}
    assert (env["word"], env["name"], env["rounded"], env["cond"]) == ("seat", "c.txt", 2.5, "yes")
    assert join_en([1]) == "1" and join_en([1, 2, 3], "or") == "1, 2 or 3"
    env, _ = run([{"let": {"xs": ["a", "b"], "t": "@", "c": "celsius"}}, {"say": ["{xs!j}|{xs!o}|{c!c}|{t}"]}])
    assert env["prompt"] == "a and b|a or b|Celsius|@"


@pytest.mark.parametrize("steps, message", [
    ([{"let": {"x": {"frobnicate": 1}}}], "unknown recipe operator 'frobnicate'"),
    ([{"jump": 1}], "unknown recipe step 'jump'"),
    ([{"say": ["{nothing}"]}], "nothing bound for 'nothing'"),
    ([{"let": {"x": "@nopool"}}], "no pool named 'nopool'"),
    ([{"let": {"x": "$unset"}}], "no value named 'unset'"),
])
def test_mistakes_in_a_recipe_are_one_line_errors(steps: list, message: str) -> None:
    with pytest.raises(RecipeError) as err:
        run(steps)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ToolfidError)


def write_vocab(folder: Path, recipe: list, extra_pools: dict | None = None) -> Path:
    common = {"settings": {"seed": 7, "year": 2026, "cases_per_tool": 3, "multi_tool_share": 0.0,
                           "tools_offered_weights": {"2": 1}, "max_prompt_chars": 300, "reserved_names": []},
              "domains": ["demo"], "pools": {"cities": POOLS["cities"]}, "samplers": {}}
    tool = {"name": "get_weather", "description": "Weather for a city.", "recipe": recipe,
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}
    (folder / "common.json").write_text(json.dumps(common))
    (folder / "demo.json").write_text(json.dumps({"domain": "demo", "neighbours": [], "pools": extra_pools or {},
                                                  "tools": [tool]}))
    return folder


def test_generator_reads_a_vocabulary_and_checks_every_case(tmp_path: Path) -> None:
    good = [{"let": {"loc": {"choice": "@cities"}}}, {"arg": {"location": "$loc"}},
            {"say": ["Weather in {loc}?", "How is {loc} today?", "{loc} weather, please."]}]
    vocab = load_vocab(write_vocab(tmp_path, good))
    cases = generate.build_cases(random.Random(1), vocab)
    generate.check(cases, vocab)
    assert [c["id"] for c in sorted(cases, key=lambda c: c["id"])] == ["demo-0001", "demo-0002", "demo-0003"]
    assert all(c["gold_arguments"]["location"] in c["prompt"] for c in cases)

    (tmp_path / "bad").mkdir()
    hidden = [{"let": {"loc": {"choice": "@cities"}}}, {"arg": {"location": "$loc"}},
              {"say": ["What's the weather where I am?", "Weather, please.", "Is it raining?"]}]
    vocab = load_vocab(write_vocab(tmp_path / "bad", hidden))
    with pytest.raises(ToolfidError, match="not in prompt: /location="):
        generate.check(generate.build_cases(random.Random(1), vocab), vocab)


def test_a_pool_defined_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolfidError, match="pool.*cities defined twice"):
        load_vocab(write_vocab(tmp_path, [], extra_pools={"cities": ["Oslo"]}))


CONVERSATION = [
    {"let": {"loc": {"choice": "@cities"}, "ids": {"sample": {"range": [100, 999]}, "k": 3}}},
    {"let": {"offers": {"map": "$ids", "as": "i",
                        "yield": {"object": {"id": "H-{i}", "price": {"randint": [50, 99]}}}}}},
    {"require": {"all_different": {"map": "$offers", "as": "o", "yield": "$o.price"}}},
    {"prompt": ["Find hotels in {loc}."]},
    {"arg": {"city": "$loc"}},
    {"call": "search_hotels"},
    {"result": {"hotels": "$offers"}},
    {"user": ["Book the cheapest."]},
    {"let": {"cheapest": {"min_by": ["$offers", "price"]},
             "pricey": {"where": "$offers", "as": "o", "if": {"gt": ["$o.price", 70]}},
             "later": {"date_add": ["2026-02-27", 3]}}},
    {"expect": "book_hotel", "args": {"hotel_id": "$cheapest.id", "guests.adults": 2}},
]


def test_conversation_steps_build_an_openai_history() -> None:
    env, _ = run(CONVERSATION, 5)
    assert env["prompt"].startswith("Find hotels in ")
    call, result, user = env["history"]
    assert call == {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "search_hotels", "arguments": {"city": env["loc"]}}}]}
    assert env["args"] == {}  # the call took the arguments set so far
    assert result["role"] == "tool" and (result["tool_call_id"], result["name"]) == ("call_1", "search_hotels")
    assert json.loads(result["content"]) == {"hotels": env["offers"]}
    assert user == {"role": "user", "content": "Book the cheapest."}
    cheapest = min(env["offers"], key=lambda o: o["price"])
    assert env["expect"] == {"name": "book_hotel", "arguments": {"hotel_id": cheapest["id"], "guests": {"adults": 2}}}
    assert env["pricey"] == [o for o in env["offers"] if o["price"] > 70] and env["later"] == "2026-03-02"
    env, _ = run([{"prompt": ["hi"]}, {"call": "ping", "args": {}}, {"result": "pong"}, {"expect": None}])
    assert env["history"][1]["content"] == "pong" and env["expect"] is None


def test_require_redraws_and_a_result_needs_a_call() -> None:
    with pytest.raises(Redraw):
        run([{"require": {"eq": [1, 2]}}])
    with pytest.raises(RecipeError, match="'result' step needs a 'call'"):
        run([{"result": {"ok": True}}])


def write_scenarios(folder: Path, scenarios: list) -> None:
    tools = [{"domain": "demo", "name": "book_hotel", "description": "Book a hotel by id.", "parameters": {
        "type": "object", "properties": {"hotel_id": {"type": "string"}}, "required": ["hotel_id"]}}]
    (folder / "multi_turn.json").write_text(json.dumps({
        "settings": {"distractor_share": 0.0, "distractors": [1], "max_tools": 5},
        "tools": tools, "scenarios": scenarios}))


def test_generator_draws_and_checks_conversations(tmp_path: Path) -> None:
    good = [{"let": {"loc": {"choice": "@cities"}, "hid": {"concat": ["H-", {"digits": 4}]}}},
            {"prompt": ["Find me a hotel in {loc}.", "Any hotels in {loc}?", "Hotels in {loc}, please."]},
            {"call": "get_weather", "args": {"location": "$loc"}},
            {"result": {"hotels": [{"object": {"hotel_id": "$hid"}}]}},
            {"user": ["Book it."]},
            {"expect": "book_hotel", "args": {"hotel_id": "$hid"}}]
    folder = write_vocab(tmp_path, [{"let": {"loc": {"choice": "@cities"}}}, {"arg": {"location": "$loc"}},
                                    {"say": ["Weather in {loc}?"]}])
    write_scenarios(folder, [{"name": "s", "domain": "demo", "kind": "mt_follow_up", "cases": 2, "recipe": good}])
    vocab = load_vocab(folder)
    cases = generate.build_cases(random.Random(3), vocab)
    generate.check(cases, vocab)
    conversations = [c for c in cases if c.get("history")]
    assert [c["id"] for c in cases[-2:]] == [c["id"] for c in conversations] and len(conversations) == 2
    assert {c["id"] for c in conversations} == {"mt-demo-0001", "mt-demo-0002"}
    assert all(c["category"] == "mt_follow_up" and c["allowed_tools"] == ["get_weather", "book_hotel"]
               for c in conversations)
    from lm_eval_toolfid.core.records import Case
    assert all(result_only_values(Case.model_validate(c)) for c in conversations)

    (tmp_path / "bad").mkdir()
    unfindable = [*good[:-1], {"expect": "book_hotel", "args": {"hotel_id": "H-0000x"}}]
    folder = write_vocab(tmp_path / "bad", good[:1] + [{"arg": {"location": "$loc"}}, {"say": ["Weather in {loc}?"]}])
    write_scenarios(folder, [{"name": "s", "domain": "demo", "kind": "mt_follow_up", "cases": 1, "recipe": unfindable}])
    vocab = load_vocab(folder)
    with pytest.raises(ToolfidError, match="not in prompt, user turns or tool results: /hotel_id='H-0000x'"):
        generate.check(generate.build_cases(random.Random(3), vocab), vocab)

    (tmp_path / "never").mkdir()
    folder = write_vocab(tmp_path / "never", good[:1] + [{"arg": {"location": "$loc"}}, {"say": ["Weather in {loc}?"]}])
    write_scenarios(folder, [{"name": "stuck", "domain": "demo", "kind": "mt_answer", "cases": 1,
                              "recipe": [{"require": False}]}])
    with pytest.raises(ToolfidError, match="scenario stuck: 100 draws in a row failed a 'require' step"):
        generate.build_cases(random.Random(3), load_vocab(folder))


def test_scenario_kinds_are_known_and_kept(tmp_path: Path) -> None:
    single = [{"let": {"loc": {"choice": "@cities"}}}, {"arg": {"location": "$loc"}}, {"say": ["Weather in {loc}?"]}]
    calls_anyway = [{"let": {"loc": {"choice": "@cities"}}}, {"prompt": ["Hotels in {loc} Old Town?"]},
                    {"call": "get_weather", "args": {"location": "$loc"}}, {"result": {"ok": True}},
                    {"expect": "get_weather", "args": {"location": "{loc} Old Town"}}]
    folder = write_vocab(tmp_path, single)
    write_scenarios(folder, [{"name": "s", "domain": "demo", "kind": "mt_answer", "cases": 1, "recipe": calls_anyway}])
    vocab = load_vocab(folder)
    with pytest.raises(ToolfidError, match="a mt_answer case must expect no call"):
        generate.check(generate.build_cases(random.Random(1), vocab), vocab)
    (tmp_path / "odd").mkdir()
    folder = write_vocab(tmp_path / "odd", single)
    write_scenarios(folder, [{"name": "s", "domain": "demo", "kind": "mt_chat", "cases": 1, "recipe": calls_anyway}])
    with pytest.raises(ToolfidError, match="unknown scenario kind"):
        load_vocab(folder)
