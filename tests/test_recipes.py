"""The recipe language of the default set's vocabulary: steps, operators, the random stream, errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lm_eval_toolfid.cases import generate
from lm_eval_toolfid.cases.recipes import Recipe, RecipeError, join_en
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
    vocab = generate.load_vocab(write_vocab(tmp_path, good))
    cases = generate.build_cases(random.Random(1), vocab)
    generate.check(cases, vocab)
    assert [c["id"] for c in sorted(cases, key=lambda c: c["id"])] == ["demo-0001", "demo-0002", "demo-0003"]
    assert all(c["gold_arguments"]["location"] in c["prompt"] for c in cases)

    (tmp_path / "bad").mkdir()
    hidden = [{"let": {"loc": {"choice": "@cities"}}}, {"arg": {"location": "$loc"}},
              {"say": ["What's the weather where I am?", "Weather, please.", "Is it raining?"]}]
    vocab = generate.load_vocab(write_vocab(tmp_path / "bad", hidden))
    with pytest.raises(ToolfidError, match="not in prompt: /location="):
        generate.check(generate.build_cases(random.Random(1), vocab), vocab)


def test_a_pool_defined_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolfidError, match="pool.*cities defined twice"):
        generate.load_vocab(write_vocab(tmp_path, [], extra_pools={"cities": ["Oslo"]}))
