"""The recipe language of the default case set's vocabulary (``cases/vocab/*.json``): a small
interpreter that runs a tool's (or a conversation's) recipe and returns what it drew: the
prompt, the gold arguments, and for a conversation its history and the expected next step.

A recipe is a list of *steps* run in order against an environment of named values. Every random
draw goes through one ``random.Random`` in the order the recipe is written, so a recipe is a
program over the random stream: the same seed gives the same cases, byte for byte.

Steps (a JSON object whose first key names the step):

- ``{"let": {"name": expr, ...}}``: evaluate each expression in order and bind it; a name
  ``"a,b"`` unpacks a two-item value.
- ``{"arg": {"path": expr, ...}}``: set a gold argument (``"passengers.children"`` sets a nested
  key); arguments keep the order in which they are first set; ``$args`` reads them back.
- ``{"if": expr, "then": [steps], "else": [steps]}``.
- ``{"some": [k, ...], "of": {"label": [steps], ...}}``: draw ``k`` from the list, then that many
  labels (``random.sample``), and run the drawn labels' steps in the order they are listed.
- ``{"say": [template, ...], "replace": [[old, new], ...]}``: draw the prompt's template, fill it
  in, and end the recipe (a ``say`` inside an ``if`` ends it early).
- ``{"require": expr}``: when false, this draw is thrown away (:class:`Redraw`) and the generator
  draws the case again (e.g. to keep the cheapest of three offers unique).
- ``{"block": "name"}``: run a named list of steps (``blocks`` in a vocabulary file), in the same
  environment: the steps several recipes share.

Conversation steps (multi-turn scenarios), building ``history`` in the OpenAI message shape:

- ``{"prompt": [template, ...]}``: draw the user's first request (the recipe goes on);
- ``{"call": "tool", "args": {"path": expr}}``: an assistant turn calling ``tool`` (ids
  ``call_1``, ``call_2``...); without ``args`` it calls with the arguments set by ``arg`` steps
  so far, and clears them;
- ``{"result": {"key": expr, ...}}`` (keys as for ``arg``) or ``{"result": expr}``: the tool
  turn answering the last call; its content is the value's JSON text (a string stays text), e.g.
  ``{"error": "..."}`` for a failed call;
- ``{"user": [template, ...]}``: a further user turn;
- ``{"expect": "tool", "args": ...}`` (arguments as for ``call``) or ``{"expect": null}`` (no
  call: the results suffice): the step the case asks for; it ends the recipe.

Expressions:

- numbers, booleans, null: themselves; a list: its items evaluated in order (all of them: a
  ``choice`` over a list of draws makes every draw, as Python does);
- ``"$name.key.0"``: a bound value (dotted keys and list indices); ``"@pool.key"``: a pool (only a
  string that is nothing but such a reference: ``"@"`` alone is text);
- a string containing ``{``: a template, filled in by Python's ``str.format`` from the bound
  values (``{x[0]}``, ``{h:02d}``; conversions ``!c`` capitalize, ``!j`` "a, b and c", ``!o``
  "a, b or c"); any other string is itself;
- an object whose first key is an operator (further keys are its named operands):

  - draws: ``choice X``, ``randint [lo, hi]``, ``chance p``, ``uniform [a, b]``, ``sample X, k``,
    ``money [lo, hi]`` (whole 30% of the time, else two decimals whose last is not 0),
    ``tenths [lo, hi]``, ``date null`` (ISO date in the settings' year, day 1-28),
    ``date_range [lo, hi]`` (a start date, and one lo..hi days later), ``clock [lo, hi]`` (HH:MM
    on a quarter hour), ``token k, alphabet``, ``digits k``, ``distinct k, each`` (k distinct
    draws of ``each``), ``use name`` (a *sampler*: a named expression in a vocabulary file);
  - building: ``object {k: expr}``, ``repeat n, do, yield``, ``map X, as, do, yield`` (``do``:
    steps run before ``yield`` is evaluated, in a scope of their own), ``where X, as, if`` (the
    items for which ``if`` holds), ``range [a, b]``, ``keys X``, ``lookup [mapping, key]``,
    ``slice [X, a, b]``, ``sorted X``, ``len X``, ``min_by [items, key]``, ``max_by [items, key]``
    (the item with the least/most), ``date_add [date, days]``;
  - arithmetic: ``add [...]`` (numbers, lists; objects are merged), ``mul [...]``,
    ``div [a, b]``, ``round [x, n]``, ``int x``;
  - text: ``concat [...]``, ``join_en X, conj``, ``join X, sep``, ``lower X``, ``basename X``,
    ``plural [n or list, one, many]``;
  - logic: ``eq``, ``ne``, ``gt`` ``[a, b]``, ``in [x, list]``, ``has [object, key]``,
    ``all_different X``, ``and [...]`` (stops at the first false: later draws are not made),
    ``if c, then, else``.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import random
import re
import string
from typing import Any, Callable

from lm_eval_toolfid.core.errors import ToolfidError

DEFAULT_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
QUARTERS = ["00", "15", "30", "45"]
_REF = re.compile(r"[$@][A-Za-z_]\w*(\.\w+)*\Z")


def join_en(items: list[Any], conj: str = "and") -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    words = [str(x) for x in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" {conj} " + words[-1]


class RecipeError(ToolfidError):
    """A recipe that cannot run (unknown step, operator or name): a mistake in a vocabulary file."""


class Redraw(Exception):
    """A ``require`` step failed: the caller draws the case again."""


class _Formatter(string.Formatter):
    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion == "c":
            return str(value).capitalize()
        if conversion in ("j", "o"):
            return join_en(value, "and" if conversion == "j" else "or")
        return super().convert_field(value, conversion)


_FORMATTER = _Formatter()


class Recipe:
    """Runs recipes against one random stream, with the vocabulary's pools and samplers."""

    def __init__(self, r: random.Random, pools: dict[str, Any], samplers: dict[str, Any], year: int,
                 blocks: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self.r, self.pools, self.samplers, self.year = r, pools, samplers, year
        self.blocks = blocks or {}
        self.env: dict[str, Any] = {}

    # ------------------------------------------------------------------ steps

    def run(self, steps: list[dict[str, Any]]) -> dict[str, Any]:
        """Run a whole recipe in a fresh environment; returns it: ``prompt``, ``args``, and for a
        conversation ``history`` and ``expect`` (``{"name", "arguments"}`` or None)."""
        self.env = {"args": {}, "history": []}
        self.steps(steps)
        return self.env

    def steps(self, steps: list[dict[str, Any]]) -> bool:
        """Run steps in order; True once a ``say`` ended the recipe."""
        for step in steps:
            kind = next(iter(step))
            handler = getattr(self, f"_step_{kind}", None)
            if handler is None:
                raise RecipeError(f"unknown recipe step {kind!r}")
            if handler(step):
                return True
        return False

    def _step_let(self, step: dict[str, Any]) -> bool:
        for name, expr in step["let"].items():
            value = self.ev(expr)
            if "," in name:
                for part, item in zip(name.split(","), value, strict=True):
                    self.env[part.strip()] = item
            else:
                self.env[name] = value
        return False

    def _step_arg(self, step: dict[str, Any]) -> bool:
        self._set_paths(self.env["args"], step["arg"])
        return False

    def _set_paths(self, into: dict[str, Any], paths: dict[str, Any]) -> dict[str, Any]:
        for path, expr in paths.items():
            *parents, leaf = path.split(".")
            node = into
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = copy.deepcopy(self.ev(expr))
        return into

    def _arguments(self, step: dict[str, Any]) -> dict[str, Any]:
        """A ``call``'s or ``expect``'s arguments: its own ``args`` mapping, or those set so far."""
        if "args" in step:
            return self._set_paths({}, step["args"])
        args, self.env["args"] = self.env["args"], {}
        return args

    def _step_if(self, step: dict[str, Any]) -> bool:
        return self.steps(step["then"] if self.ev(step["if"]) else step.get("else", []))

    def _step_some(self, step: dict[str, Any]) -> bool:
        labels = list(step["of"])
        drawn = self.r.sample(labels, self.r.choice(step["some"]))
        return any(self.steps(step["of"][label]) for label in labels if label in drawn)

    def _step_say(self, step: dict[str, Any]) -> bool:
        text = self.fill(self.r.choice(step["say"]))
        for old, new in step.get("replace", []):
            text = text.replace(old, new)
        self.env["prompt"] = text
        return True

    def _step_block(self, step: dict[str, Any]) -> bool:
        if step["block"] not in self.blocks:
            raise RecipeError(f"no block named {step['block']!r}")
        return self.steps(self.blocks[step["block"]])

    def _step_require(self, step: dict[str, Any]) -> bool:
        if not self.ev(step["require"]):
            raise Redraw(json.dumps(step["require"]))
        return False

    # ------------------------------------------------------------------ conversation steps

    def _step_prompt(self, step: dict[str, Any]) -> bool:
        self.env["prompt"] = self.fill(self.r.choice(step["prompt"]))
        return False

    def _step_call(self, step: dict[str, Any]) -> bool:
        history = self.env["history"]
        call_id = f"call_{sum(m['role'] == 'assistant' for m in history) + 1}"
        history.append({"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": step["call"], "arguments": self._arguments(step)}}]})
        self.env["last_call"] = (call_id, step["call"])
        return False

    def _step_result(self, step: dict[str, Any]) -> bool:
        if "last_call" not in self.env:
            raise RecipeError("a 'result' step needs a 'call' before it")
        spec = step["result"]
        value = self._set_paths({}, spec) if isinstance(spec, dict) else self.ev(spec)
        call_id, name = self.env.pop("last_call")
        content = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        self.env["history"].append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
        return False

    def _step_user(self, step: dict[str, Any]) -> bool:
        self.env["history"].append({"role": "user", "content": self.fill(self.r.choice(step["user"]))})
        return False

    def _step_expect(self, step: dict[str, Any]) -> bool:
        name = step["expect"]
        self.env["expect"] = None if name is None else {"name": name, "arguments": self._arguments(step)}
        return True

    # ------------------------------------------------------------------ expressions

    def fill(self, template: str) -> str:
        try:
            return _FORMATTER.vformat(template, (), self.env)
        except (KeyError, IndexError, AttributeError) as exc:
            raise RecipeError(f"template {template!r}: nothing bound for {exc}") from None

    def ev(self, x: Any) -> Any:
        if isinstance(x, list):
            return [self.ev(item) for item in x]
        if isinstance(x, str):
            if _REF.match(x):
                return self._path(x)
            return self.fill(x) if "{" in x else x
        if isinstance(x, dict):
            op = next(iter(x))
            fn = _OPS.get(op)
            if fn is None:
                raise RecipeError(f"unknown recipe operator {op!r}")
            return fn(self, x)
        return x

    def _path(self, ref: str) -> Any:
        head, *keys = ref[1:].split(".")
        source = self.env if ref[0] == "$" else self.pools
        if head not in source:
            raise RecipeError(f"{ref}: no {'value' if ref[0] == '$' else 'pool'} named {head!r}")
        node = source[head]
        for key in keys:
            node = node[int(key)] if isinstance(node, list) else node[key]
        return node

    def scoped(self, node: dict[str, Any], bind: dict[str, Any]) -> Any:
        """Run ``node``'s ``do`` steps and evaluate its ``yield`` with ``bind`` added, then restore."""
        saved = self.env
        self.env = {**saved, **bind}
        try:
            self.steps(node.get("do", []))
            return self.ev(node["yield"])
        finally:
            self.env = saved

    # ------------------------------------------------------------------ samplers

    def day(self) -> dt.date:
        return dt.date(self.year, self.r.randint(1, 12), self.r.randint(1, 28))

    def money(self, lo: int, hi: int, whole_share: float = 0.3) -> int | float:
        if self.r.random() < whole_share:
            return self.r.randint(lo, hi)
        cents = self.r.randint(lo * 100, hi * 100)
        if cents % 10 == 0:
            cents += self.r.randint(1, 9)
        return cents / 100

    def distinct(self, k: int, each: Any) -> list[Any]:
        out: list[Any] = []
        while len(out) < k:
            value = self.ev(each)
            if value not in out:
                out.append(value)
        return out


def _two(fn: Callable[[Any, Any], Any]) -> Callable[[Recipe, dict[str, Any]], Any]:
    return lambda R, n: fn(*R.ev(n[next(iter(n))]))


def _one(fn: Callable[[Any], Any]) -> Callable[[Recipe, dict[str, Any]], Any]:
    return lambda R, n: fn(R.ev(n[next(iter(n))]))


def _date_range(R: Recipe, n: dict[str, Any]) -> list[str]:
    lo, hi = R.ev(n["date_range"])
    start = R.day()
    return [start.isoformat(), (start + dt.timedelta(days=R.r.randint(lo, hi))).isoformat()]


def _and(R: Recipe, n: dict[str, Any]) -> bool:
    return all(R.ev(term) for term in n["and"])  # all() stops at the first false: later draws skipped


def _reduce(fn: Callable[[Any, Any], Any]) -> Callable[[Recipe, dict[str, Any]], Any]:
    def run(R: Recipe, n: dict[str, Any]) -> Any:
        first, *rest = R.ev(n[next(iter(n))])
        for item in rest:
            first = fn(first, item)
        return first
    return run


_OPS: dict[str, Callable[[Recipe, dict[str, Any]], Any]] = {
    # draws
    "choice": lambda R, n: R.r.choice(R.ev(n["choice"])),
    "randint": lambda R, n: R.r.randint(*R.ev(n["randint"])),
    "chance": lambda R, n: R.r.random() < R.ev(n["chance"]),
    "uniform": lambda R, n: R.r.uniform(*R.ev(n["uniform"])),
    "sample": lambda R, n: R.r.sample(R.ev(n["sample"]), R.ev(n["k"])),
    "money": lambda R, n: R.money(*R.ev(n["money"])),
    "tenths": lambda R, n: (lambda lo, hi: R.r.randint(lo, hi - 1) + R.r.randint(1, 9) / 10)(*R.ev(n["tenths"])),
    "date": lambda R, n: R.day().isoformat(),
    "date_range": _date_range,
    "clock": lambda R, n: (lambda lo, hi: f"{R.r.randint(lo, hi):02d}:{R.r.choice(QUARTERS)}")(*R.ev(n["clock"])),
    "token": lambda R, n: "".join(R.r.choice(n.get("alphabet", DEFAULT_ALPHABET)) for _ in range(R.ev(n["token"]))),
    "digits": lambda R, n: (lambda k: str(R.r.randint(10 ** (k - 1), 10 ** k - 1)))(R.ev(n["digits"])),
    "distinct": lambda R, n: R.distinct(R.ev(n["distinct"]), n["each"]),
    "use": lambda R, n: R.ev(R.samplers[n["use"]]),
    # building
    "object": lambda R, n: {k: R.ev(v) for k, v in n["object"].items()},
    "repeat": lambda R, n: [R.scoped(n, {}) for _ in range(R.ev(n["repeat"]))],
    "map": lambda R, n: [R.scoped(n, {n["as"]: item}) for item in R.ev(n["map"])],
    "where": lambda R, n: [item for item in R.ev(n["where"]) if R.scoped({"yield": n["if"]}, {n["as"]: item})],
    "range": _two(lambda a, b: list(range(a, b))),
    "keys": _one(list),
    "lookup": _two(lambda mapping, key: mapping[key]),
    "slice": lambda R, n: (lambda x, a, b: x[a:b])(*R.ev(n["slice"])),
    "sorted": _one(sorted),
    "len": _one(len),
    # arithmetic
    "add": _reduce(lambda a, b: a | b if isinstance(a, dict) else a + b),
    "mul": _reduce(lambda a, b: a * b),
    "div": _two(lambda a, b: a / b),
    "round": _two(round),
    "int": _one(int),
    # text
    "concat": lambda R, n: "".join(str(R.ev(part)) for part in n["concat"]),
    "join_en": lambda R, n: join_en(R.ev(n["join_en"]), n.get("conj", "and")),
    "join": lambda R, n: n.get("sep", ", ").join(str(x) for x in R.ev(n["join"])),
    "lower": _one(str.lower),
    "basename": _one(lambda path: path.rsplit("/", 1)[1]),
    "plural": lambda R, n: (lambda k, one, many: one if (k if isinstance(k, int) else len(k)) == 1 else many)(
        *R.ev(n["plural"])),
    "min_by": _two(lambda items, key: min(items, key=lambda item: item[key])),
    "max_by": _two(lambda items, key: max(items, key=lambda item: item[key])),
    "date_add": _two(lambda day, n: (dt.date.fromisoformat(day) + dt.timedelta(days=n)).isoformat()),
    # logic
    "all_different": _one(lambda xs: len({json.dumps(x, sort_keys=True) for x in xs}) == len(xs)),
    "eq": _two(lambda a, b: a == b),
    "ne": _two(lambda a, b: a != b),
    "gt": _two(lambda a, b: a > b),
    "in": _two(lambda x, xs: x in xs),
    "has": _two(lambda obj, key: key in obj),
    "and": _and,
    "if": lambda R, n: R.ev(n["then"] if R.ev(n["if"]) else n["else"]),
}
