#!/usr/bin/env python
"""Benchmark: ``toolfid power``'s exact sums against the plain path, and how long the questions take.

1. Per n (268, 1000, 2000; base 0.9, drop 0.10 on a discordance of 0.04): the exact rates by the
   discordant-cells path (point mode), by every table (noninferiority mode; and with hallucination
   rates 0.02 → 0.05), and a 20,000-run Monte Carlo. Target: n = 2,000 in under 5 s on every path.
2. The plain path (``judge_table``: build the table's PairScores, ``summarize``, ``judge``) timed on
   200 of the tables the exact sum visits, and the same 200 tables by ``decide``; both labels are
   compared, and the plain path's time for the whole sum is extrapolated from its time per table.
3. ``solve_n`` for three drops and ``solve_drop`` at 268 cases.

Usage: ``nice -n 10 .venv/bin/python bench/bench_power.py``
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from lm_eval_toolfid.scoring import power as pw  # noqa: E402
from lm_eval_toolfid.scoring.power.tables import _blocks, _chunk  # noqa: E402
from lm_eval_toolfid.scoring.verdict import VerdictConfig  # noqa: E402

POINT = VerdictConfig()
NONINF = VerdictConfig(gate_mode="noninferiority")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    scenario = pw.Scenario.with_drop(0.9, 0.10, 0.04)
    halluc = pw.Scenario.with_drop(0.9, 0.10, 0.04, halluc_base=0.02, halluc_adapter=0.05)
    print("exact sums (s) — base 0.90, drop 0.100, discordance 0.040")
    print(f"{'n':>6} {'point (cells)':>14} {'noninf (tables)':>16} {'+halluc (tables)':>17} {'tables':>10} "
          f"{'monte carlo 20k':>16}")
    for n in (268, 1000, 2000):
        point, t_point = timed(lambda: pw.verdict_rates(scenario, n, POINT))
        noninf, t_noninf = timed(lambda: pw.verdict_rates(scenario, n, NONINF))
        _, t_halluc = timed(lambda: pw.verdict_rates(halluc, n, NONINF))
        _, t_mc = timed(lambda: pw.simulate_rates(scenario, n, NONINF, runs=20_000))
        print(f"{n:>6} {t_point:>14.3f} {t_noninf:>16.3f} {t_halluc:>17.3f} {noninf.tables:>10,} {t_mc:>16.3f}")

    n = 268
    blocks = _blocks(scenario, n, pw.DEFAULT_TOL)
    chunks = [_chunk(b, n) for b in blocks]
    n11, n10, n01, n00 = (np.concatenate([getattr(c, f) for c in chunks]) for f in ("n11", "n10", "n01", "n00"))
    pick = np.random.default_rng(0).choice(len(n11), size=200, replace=False)
    sample = [(int(n11[i]), int(n10[i]), int(n01[i]), int(n00[i])) for i in pick]
    plain, t_plain = timed(lambda: [pw.judge_table(*t, NONINF).label for t in sample])
    fast, t_fast = timed(lambda: pw.decide(*np.array(sample).T, NONINF))
    same = all(pw.LABELS[f] == p for f, p in zip(fast, plain))
    per_table = t_plain / len(sample)
    exact, t_exact = timed(lambda: pw.verdict_rates(scenario, n, NONINF))
    print(f"\nplain path (summarize + judge) at n={n}: {1000 * per_table:.2f} ms/table; the {exact.tables:,} tables "
          f"of the exact sum would take ~{per_table * exact.tables:.0f} s; the exact sum took {t_exact:.3f} s "
          f"(~{per_table * exact.tables / t_exact:,.0f}x); 200 sampled tables: decide {1000 * t_fast:.1f} ms, "
          f"labels {'identical' if same else 'DIFFER'}")

    print("\nsolve_n (base 0.90, discordance 0.040, point):")
    for drop in (0.10, 0.07, 0.06):
        plan, t = timed(lambda: pw.solve_n(pw.Scenario.with_drop(0.9, drop, 0.04)))
        print(f"  drop {drop:.3f}: n={plan.n} (stable from {plan.n_stable}), {len(plan.checked)} sizes evaluated, "
              f"{t:.2f} s")
    plan, t = timed(lambda: pw.solve_drop(0.9, 268, 0.04))
    print(f"solve_drop (n=268): {plan.drop:.3f}, {t:.2f} s")


if __name__ == "__main__":
    main()
