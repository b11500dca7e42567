"""Adversarial corpus benchmark for the tool-call parser.

Generates a seeded corpus of adversarial generations (nesting to 100k levels, 1 MB strings,
brace bombs, unbalanced quotes, lone surrogates, NaN/Infinity, huge ints, duplicate keys, every
format rendered and then broken, hostile pythonic, tag bombs) and runs each through the path a
generation takes in a run: ``score_generation`` (which parses) → ``model_dump(mode="json")`` →
``json.dumps``. Prints the count, mean, p99 and worst time per case (overall and per family),
and the description of the worst input. Every number comes from this one run.

    .venv/bin/python bench/bench_fuzz_corpus.py              # 100,000 cases, seed 0
    .venv/bin/python bench/bench_fuzz_corpus.py --n 5000 --seed 3
"""

from __future__ import annotations

import argparse
import gc
import json
import keyword
import random
import statistics
import string
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lm_eval_toolfid.formats import FORMATS, SCAN_CAP, render_calls  # noqa: E402
from lm_eval_toolfid.core.records import Case  # noqa: E402
from lm_eval_toolfid.scoring.outcome import score_generation  # noqa: E402

CASE = Case.model_validate({
    "id": "bench",
    "prompt": "What's the weather in Paris?",
    "tools": [
        {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                           "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["city"]}},
        {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                            "required": ["tz"]}},
    ],
    "gold_tool_name": "get_weather",
})

SPECIALS = ['{', '}', '[', ']', '"', '\\', ',', ':', '\n', '<', '>', '(', ')', '=', ';', "'", "\ud800", "\udfff",
            "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<function=", "</function>",
            "<parameter=", "</parameter>", "```", "NaN", "-Infinity", '{"name":', '"arguments":', '"parameters":']
HOSTILE_EXPR = ["__import__('os').system('true')", "exec('import sys; sys.PWNED = 1')", "x", "1+2", "{1, 2}",
                "b'x'", "1j", "lambda: 1", "[i for i in y]", "f()", "*a", "...", "1e999", "-True", "a.b",
                "[" * 1000 + "]" * 1000, "(" * 5000, "9" * 5000, "'" + "x" * 100_000 + "'"]


def rand_word(rng: random.Random) -> str:
    while True:
        w = "".join(rng.choice(string.ascii_lowercase + "_") for _ in range(rng.randint(1, 10)))
        if not keyword.iskeyword(w):
            return w


def rand_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-10**12, 10**12)
    if kind == 3:
        return rng.uniform(-1e6, 1e6)
    if kind == 4:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 20)))
    if kind in (5, 6):
        return {rand_word(rng): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def rand_calls(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    calls = [(rng.choice(["get_weather", "get_time", rand_word(rng)]),
              {rand_word(rng): rand_value(rng) for _ in range(rng.randint(0, 4))})
             for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return calls


def rendering(rng: random.Random) -> tuple[str, str]:
    fmt = rng.choice(FORMATS)
    markers = rng.random() < 0.5
    calls = rand_calls(rng)
    try:
        return fmt, render_calls(calls, fmt, markers=markers)
    except ValueError:
        return fmt, render_calls(calls[:1], fmt, markers=markers)


def mutate(rng: random.Random, text: str) -> tuple[str, list[str]]:
    done = []
    for _ in range(rng.randint(1, 4)):
        how = rng.choice(["truncate", "insert", "delete", "duplicate", "wrap", "nest", "swap", "unclose"])
        at = rng.randint(0, len(text))
        if how == "truncate":
            text = text[:at]
        elif how == "insert":
            text = text[:at] + rng.choice(SPECIALS) + text[at:]
        elif how == "delete":
            text = text[:at] + text[at + rng.randint(1, 8):]
        elif how == "duplicate":
            text = text * rng.randint(2, 200)
        elif how == "wrap":
            text = "Sure! " + text + " Hope this helps."
        elif how == "nest":
            text = rng.choice(["{", "[", '{"a":', "<tool_call>", "f(a=", "[TOOL_CALLS]"]) * rng.randint(1, 5000) + text
        elif how == "unclose":
            text = text.replace("</tool_call>", "").replace("</function>", "").replace("</parameter>", "")
        else:
            text = text[at:] + text[:at]
        text = text[:MAX_INPUT]
        done.append(how)
    return text, done


CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
MAX_INPUT = 2_000_000  # generated inputs are cut here (the parser itself scans only SCAN_CAP)


def families() -> dict[str, Callable[[random.Random], tuple[str, str]]]:
    def valid(rng):
        fmt, text = rendering(rng)
        return f"valid rendering ({fmt})", text

    def broken(rng):
        fmt, text = rendering(rng)
        text, how = mutate(rng, text)
        return f"{fmt} broken by {'+'.join(how)}", text

    def nesting(rng):
        depth = rng.choice([10, 100, 1000, 10_000, 100_000])
        opener, closer = rng.choice([("[", "]"), ("{", "}"), ('{"a":', "}"), ('[{"a":', "}]"), ("f(a=[", "])")])
        closed = rng.random() < 0.5
        text = opener * depth + ("1" if opener.endswith(":") else "") + (closer * depth if closed else "")
        if rng.random() < 0.5:
            text = '{"name": "get_weather", "arguments": {"city": ' + text + "}}"
        return f"nesting {opener!r}x{depth} {'closed' if closed else 'open'}", text

    def big_string(rng):
        size = rng.choice([100_000, 1_000_000])
        body = rng.choice(["x", "\\", '\\"', "{", "é", "\ud800"]) * (size // 2)
        where = rng.choice(["argument", "prose", "unterminated"])
        if where == "argument":
            text = '{"name": "get_weather", "arguments": {"city": "' + body + '"}}'
        elif where == "prose":
            text = body + CALL
        else:
            text = '{"name": "get_weather", "arguments": {"city": "' + body
        return f"{size // 1000} kB string ({where}, {body[:2]!r})", text

    def brace_bomb(rng):
        piece = rng.choice(["{", "x{", '{"a":', "{}", "[]", '"{', '{"', "[{", "}]", '{"[', '{"a\\\\', "[x",
                            '{"name":', CALL + " ", "{[", "[1,"])
        n = rng.choice([100, 1000, 10_000, 50_000, 100_000])
        prefix = rng.choice(["", "[x", "{"])
        text = prefix + piece * n + rng.choice(["", CALL])
        return f"bomb {prefix!r}+{piece[:12]!r}x{n}", text

    def quotes(rng):
        words = [rng.choice(['"', "said", "{", "it's", '"hi', "}", "[", "x"]) for _ in range(rng.randint(5, 2000))]
        words.insert(rng.randint(0, len(words)), CALL)
        return "unbalanced quotes in prose", " ".join(words)

    def surrogates(rng):
        text = rendering(rng)[1]
        for _ in range(rng.randint(1, 10)):
            at = rng.randint(0, len(text))
            text = text[:at] + chr(rng.randint(0xD800, 0xDFFF)) + text[at:]
        if rng.random() < 0.5:
            text = text.replace('"Paris"', '"\\ud800\\udfff\\ud83d"')
        return "lone surrogates", text

    def nan(rng):
        const = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "nan", "inf"])
        return f"non-finite {const}", '{"name": "get_weather", "arguments": {"city": "P", "days": ' + const + "}}"

    def huge_int(rng):
        digits = rng.choice([4000, 4300, 4301, 10_000, 100_000])
        num = "9" * digits
        wrap = rng.choice(["json", "pythonic", "qwen"])
        if wrap == "json":
            text = '{"name": "get_weather", "arguments": {"city": "P", "days": ' + num + "}}"
        elif wrap == "pythonic":
            text = f"[get_weather(city='P', days={num})]"
        else:
            text = f"<function=get_weather>\n<parameter=days>\n{num}\n</parameter>\n</function>"
        return f"huge int {digits} digits ({wrap})", text

    def dup_keys(rng):
        n = rng.choice([2, 10, 10_000])
        body = ", ".join(f'"city": "c{i}"' for i in range(n))
        return f"duplicate keys x{n}", '{"name": "get_weather", "name": "x", "arguments": {' + body + "}}"

    def hostile_pythonic(rng):
        expr = rng.choice(HOSTILE_EXPR)
        form = rng.choice(["f(a={e})", "[get_weather(city={e})]", "<|python_tag|>f(a={e})", "```python\nf(a={e})\n```"])
        return f"hostile pythonic {expr[:20]!r}", form.format(e=expr)

    def tag_bomb(rng):
        piece = rng.choice(["<tool_call>", "</tool_call>", "<tool_call>{", "<function=a>", "<function=a><parameter=b>",
                            "<parameter=", "[TOOL_CALLS]", "[TOOL_CALLS]f{", "[TOOL_CALLS]f[ARGS]", "<|python_tag|>",
                            "```", "```json\n{", "f{", "<tool_call>" + CALL])
        n = rng.choice([10, 1000, 20_000])
        return f"tag bomb {piece[:16]!r}x{n}", piece * n

    return {f.__name__: f for f in [valid, broken, nesting, big_string, brace_bomb, quotes, surrogates, nan,
                                     huge_int, dup_keys, hostile_pythonic, tag_bomb]}


RETIME = 20
WEIGHTS = {"valid": 20, "broken": 30, "nesting": 6, "big_string": 2, "brace_bomb": 6, "quotes": 6, "surrogates": 8,
           "nan": 4, "huge_int": 4, "dup_keys": 3, "hostile_pythonic": 6, "tag_bomb": 5}


def corpus(n: int, seed: int) -> Iterator[tuple[str, str, str]]:
    rng = random.Random(seed)
    fams = families()
    names = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in names]
    for _ in range(n):
        family = rng.choices(names, weights)[0]
        description, text = fams[family](rng)
        yield family, description, text


def run_one(text: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) for one case."""
    cpu, wall = time.thread_time(), time.perf_counter()
    outcome = score_generation(text, CASE)
    json.dumps(outcome.model_dump(mode="json"))
    return time.thread_time() - cpu, time.perf_counter() - wall


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="generations in the corpus (default 100000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    times: list[float] = []  # CPU time of this thread per case
    walls: list[float] = []  # wall-clock time per case (includes time the OS gave other processes)
    by_family: dict[str, list[float]] = defaultdict(list)
    worst = (0.0, "", "")
    slowest: list[tuple[float, str, str, str]] = []  # the RETIME slowest cases, re-timed at the end
    errors: list[tuple[str, str]] = []
    total_chars = 0
    gc.disable()  # measure the parser, not when the collector happens to run
    wall = time.perf_counter()
    try:
        for i, (family, description, text) in enumerate(corpus(args.n, args.seed)):
            total_chars += min(len(text), SCAN_CAP)
            try:
                t, w = run_one(text)
            except Exception as exc:  # noqa: BLE001 - report, do not stop the benchmark
                errors.append((description, f"{type(exc).__name__}: {exc}"[:200]))
                continue
            times.append(t)
            walls.append(w)
            by_family[family].append(t)
            if t > worst[0]:
                worst = (t, family, description)
            if len(slowest) < RETIME or t > slowest[-1][0]:
                slowest.append((t, family, description, text))
                slowest.sort(key=lambda x: -x[0])
                del slowest[RETIME:]
            if i % 1000 == 999:
                gc.collect()
    finally:
        gc.enable()
    wall = time.perf_counter() - wall

    ms = 1000.0
    print(f"corpus: {args.n} generations, seed {args.seed}, {total_chars / 1e6:.1f} M chars scanned "
          f"(scan cap {SCAN_CAP}), wall {wall:.1f} s")
    print("per case = score_generation (parse + schema check) + model_dump(mode='json') + json.dumps;")
    print("times are CPU time of the benchmark thread (wall-clock summary at the end)")
    print(f"{'family':18s} {'count':>7s} {'mean ms':>9s} {'p99 ms':>9s} {'worst ms':>9s}")
    for family in WEIGHTS:
        ts = by_family.get(family, [])
        if ts:
            print(f"{family:18s} {len(ts):7d} {statistics.fmean(ts) * ms:9.3f} {pct(ts, 0.99) * ms:9.3f} "
                  f"{max(ts) * ms:9.3f}")
    print(f"{'ALL':18s} {len(times):7d} {statistics.fmean(times) * ms:9.3f} {pct(times, 0.99) * ms:9.3f} "
          f"{max(times) * ms:9.3f}")
    print(f"worst input: {worst[2]} [{worst[1]}] took {worst[0] * ms:.1f} ms")
    over = sum(t > 0.050 for t in times)
    print(f"cases over 50 ms CPU: {over} ({over / max(1, len(times)):.3%})")
    print(f"wall clock per case: mean {statistics.fmean(walls) * ms:.3f} ms, p99 {pct(walls, 0.99) * ms:.3f} ms, "
          f"worst {max(walls) * ms:.1f} ms (includes waiting for the CPU on a shared machine)")
    # On a shared machine a single timing can include cache and scheduler noise: re-time the
    # slowest cases (best of 5) to tell a slow input from a noisy measurement.
    retimed = sorted(((min(run_one(text)[0] for _ in range(5)), t, fam, desc)
                      for t, fam, desc, text in slowest), reverse=True)
    print(f"the {len(retimed)} slowest cases re-timed (best of 5 CPU):")
    for best, first, fam, desc in retimed[:5]:
        print(f"  {best * ms:8.2f} ms (first run {first * ms:7.2f} ms)  {desc} [{fam}]")
    print(f"exceptions: {len(errors)}")
    for description, err in errors[:10]:
        print(f"  {description}: {err}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
