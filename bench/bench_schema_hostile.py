"""Time schema validation on ordinary and hostile inputs; prints numbers measured in this run.

    .venv/bin/python bench/bench_schema_hostile.py

1. ordinary validation: every default case's gold arguments against its gold tool's schema,
   toolfid's validate_arguments (cache lookup by normalised schema, formats, guards) vs a
   prebuilt plain jsonschema validator;
2. the classic catastrophic pattern ``^(a+)+$`` on ``a``×n + ``!``: Python ``re`` (what
   jsonschema would use) vs toolfid (RE2), for growing n;
3. a pattern RE2 cannot run (lookahead) on the same input: wall time until ``pattern_timeout``.
"""

from __future__ import annotations

import re
import statistics
import time

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from lm_eval_toolfid.core import schema as S
from lm_eval_toolfid.cases.load import load_cases


def per_call_us(fn, items, repeat: int = 5) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            fn(*item)
        runs.append((time.perf_counter() - start) / len(items) * 1e6)
    return statistics.median(runs)


def main() -> None:
    cases = [c for c in load_cases("default") if not c.history]  # single-turn: one gold call each
    pairs = [(c.gold_arguments or {}, c.gold_tool.parameters) for c in cases]
    plain = {id(p): Draft202012Validator(S.normalize_schema(p)) for _, p in pairs}
    ours = per_call_us(S.validate_arguments, pairs)
    theirs = per_call_us(lambda a, p: best_match(plain[id(p)].iter_errors(a)), pairs)
    print(f"ordinary validation ({len(pairs)} single-turn default cases, median of 5): toolfid {ours:.1f} us/call, "
          f"plain jsonschema validator, prebuilt, no cache lookup {theirs:.1f} us/call")

    params = {"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    print("catastrophic '^(a+)+$' on 'a'*n+'!':")
    for n in (18, 20, 22, 24, 40, 10_000):
        text = "a" * n + "!"
        start = time.perf_counter()
        violation = S.validate_arguments({"s": text}, params)
        ours_s = time.perf_counter() - start
        if n <= 24:
            start = time.perf_counter()
            re.search("^(a+)+$", text)
            python_s = f"{time.perf_counter() - start:.3f} s"
        else:
            python_s = "not run (about 2^n steps)"
        print(f"  n={n:>6}: toolfid/RE2 {ours_s * 1e3:.3f} ms -> {violation.keyword}; Python re {python_s}")

    lookahead = {"properties": {"s": {"type": "string", "pattern": "^(?=a)(a+)+$"}}}
    start = time.perf_counter()
    violation = S.validate_arguments({"s": "a" * 40 + "!"}, lookahead)
    print(f"lookahead '^(?=a)(a+)+$' (Python re, budget {S.PATTERN_BUDGET_S} s): "
          f"{time.perf_counter() - start:.3f} s -> {violation.keyword}")


if __name__ == "__main__":
    main()
