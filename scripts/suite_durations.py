"""Where the suite's minutes go: read pytest's ``--durations=0`` report and print time by module and phase.

Usage: ``.venv/bin/python -m pytest -q -rs --durations=0 > run.log; python scripts/suite_durations.py run.log``
(``--write-costs tests/module_costs.json`` also records the seconds per module that tests/conftest.py orders by).
Prints a markdown table (module, tests, set-up s, call s, total s, share of the sum) sorted by total, then the
slowest set-ups (module fixtures: model conversion, LoRA training, base views). Set-up time of a module
fixture is charged to the first test that requests it, so the set-up column is where shared work shows.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S+?)::(\S+)")


def parse(text: str) -> list[tuple[float, str, str, str]]:
    rows = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3), m.group(4)))
    return rows


def main(argv: list[str]) -> int:
    write_costs = None
    if len(argv) == 3 and argv[1] == "--write-costs":
        write_costs = argv[2]
    elif len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: suite_durations.py PYTEST_LOG [--write-costs tests/module_costs.json]", file=sys.stderr)
        return 2
    try:
        text = open(argv[0], encoding="utf-8").read()
    except OSError as exc:
        print(f"suite_durations.py: cannot read {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 2
    rows = parse(text)
    if not rows:
        print(f"{argv[0]}: no duration lines (run pytest with --durations=0 -vv or --durations-min=0)", file=sys.stderr)
        return 2
    by_module: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    tests: dict[str, set[str]] = defaultdict(set)
    for secs, phase, module, test in rows:
        by_module[module][phase] += secs
        tests[module].add(test)
    total = sum(sum(p.values()) for p in by_module.values())
    if write_costs:  # the order tests/conftest.py hands modules out in: costliest first
        import json

        from pathlib import Path

        costs = {p.name: 0.0 for p in Path(write_costs).parent.glob("test_*.py")}  # under pytest's 5 ms: free
        costs.update({m.removeprefix("tests/"): round(sum(p.values()), 1) for m, p in by_module.items()})
        with open(write_costs, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(costs.items(), key=lambda kv: -kv[1])), f, indent=1)
            f.write("\n")
    print(f"sum of test times: {total:.0f} s ({total / 60:.1f} min) over {len(by_module)} modules\n")
    print("| module | tests | set-up s | call s | total s | share |")
    print("|---|---:|---:|---:|---:|---:|")
    for module, phases in sorted(by_module.items(), key=lambda kv: -sum(kv[1].values())):
        t = sum(phases.values())
        print(f"| {module.removeprefix('tests/')} | {len(tests[module])} | {phases['setup']:.1f} | "
              f"{phases['call']:.1f} | {t:.1f} | {100 * t / total:.1f}% |")
    print("\nslowest set-ups (fixtures built for the first test that asks):\n")
    for secs, phase, module, test in sorted((r for r in rows if r[1] == "setup"), key=lambda r: -r[0])[:15]:
        print(f"- {secs:.1f} s  {module.removeprefix('tests/')}::{test}")
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly, as Unix tools do
    sys.exit(main(sys.argv[1:]))
