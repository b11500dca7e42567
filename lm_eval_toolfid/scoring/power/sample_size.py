"""The n needed: the smallest n with P(FAIL | a drop) ≥ power and P(FAIL | its faithful counterpart) ≤ alpha —
exact (:func:`solve_n`) or, with conversations as a stratum of their own, by seeded Monte Carlo
(:func:`solve_n_strata`). Both rates are sawtooth curves in n, so the search scans past its candidates."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.scoring.power.exact import MAX_TABLES, _table_count, fail_rate, verdict_rates
from lm_eval_toolfid.scoring.power.limits import _infeasible, _strata_infeasible
from lm_eval_toolfid.scoring.power.monte_carlo import DEFAULT_RUNS, simulate_rates
from lm_eval_toolfid.scoring.power.rates import _check_n
from lm_eval_toolfid.scoring.power.scenario import MultiTurn, Scenario, _mixture
from lm_eval_toolfid.scoring.verdict import VerdictConfig

DEFAULT_POWER = 0.8
DEFAULT_ALPHA = 0.05
N_MAX = 100_000
"""Largest n :func:`solve_n` searches."""


@dataclass(frozen=True)
class SampleSizePlan:
    """The answer of :func:`solve_n`."""

    scenario: Scenario
    power: float
    alpha: float
    n: int | None
    """The smallest n meeting both targets; None when none does (``reason`` says why)."""
    fail_rate: float | None = None
    """P(FAIL | the scenario) at n: the power."""
    false_alarm: float | None = None
    """P(FAIL | its faithful counterpart) at n."""
    n_stable: int | None = None
    """From here on every n checked meets both targets (two sawtooth periods in a row)."""
    faithful_pass: float | None = None
    """Noninferiority mode: P(PASS | the faithful counterpart) at n (the rest is mostly UNDECIDED)."""
    reason: str = ""
    checked: dict[int, tuple[float, float | None]] = field(default_factory=dict)
    """Every n evaluated: (P(FAIL | scenario), P(FAIL | faithful) — None when the power fell short)."""
    multi_turn: MultiTurn | None = None
    """:func:`solve_n_strata`: the conversations' stratum (``scenario`` is then the single-turn cases)."""
    runs: int | None = None
    """:func:`solve_n_strata`: Monte Carlo runs per rate (None: exact)."""


def _sawtooth_run(config: VerdictConfig) -> int:
    """Consecutive n to check past a candidate: two periods of the sawtooth (the FAIL threshold
    |floor| · n steps up by one case every 1 / |floor| cases), at least 32, at most 200."""
    floor = abs(config.validity_delta_floor)
    return 200 if floor == 0 else min(200, max(32, math.ceil(2 / floor)))


def solve_n(scenario: Scenario, config: VerdictConfig = VerdictConfig(), power: float = DEFAULT_POWER,
            alpha: float = DEFAULT_ALPHA, n_max: int = N_MAX) -> SampleSizePlan:
    """The smallest n with P(FAIL | scenario) ≥ ``power`` and P(FAIL | its faithful counterpart) ≤ ``alpha``.

    Exact (validity and base gates). Counts are discrete, so both rates are sawtooth curves in n:
    doubling finds an n that meets both targets, bisection a boundary below it, and a scan downward
    (until two sawtooth periods in a row fall short) the smallest n that meets them, so ``n − 1``
    falls short; a scan upward finds ``n_stable``, where the targets hold for two periods in a row.
    """
    if not 0 < power < 1 or not 0 < alpha < 1:
        raise ToolfidError("power and alpha must be in (0, 1)")
    if scenario.hallucinates:
        raise ToolfidError("sample sizes are planned for the validity gate: give no hallucination rates")
    if scenario.drop <= 0:
        raise ToolfidError(f"a drop of {scenario.drop:.3f} is no regression: give a drop > 0")
    _check_n(n_max)
    if scenario.gained > scenario.base_validity:
        raise ToolfidError(f"the faithful counterpart (lost = gained = {scenario.gained:.3f}) is impossible for a "
                           f"base validity of {scenario.base_validity:.2f}: lower the discordance")
    faithful = scenario.faithful()
    reason = _infeasible(scenario, faithful, config, power, alpha)
    if reason:
        return SampleSizePlan(scenario, power, alpha, None, reason=reason)
    memo: dict[int, tuple[float, float | None]] = {}

    def meets(n: int) -> bool:
        if n not in memo:
            hit = fail_rate(scenario, n, config)
            memo[n] = (hit, fail_rate(faithful, n, config) if hit >= power else None)
        hit, alarm = memo[n]
        return alarm is not None and hit >= power and alarm <= alpha

    found = _smallest_n(meets, n_max, _sawtooth_run(config))
    if found is None:
        return SampleSizePlan(scenario, power, alpha, None, checked=memo,
                              reason=f"not reached by n={n_max:,} (the drop is close to the floor)")
    best, stable = found
    hit, alarm = memo[best]
    faithful_pass = None
    if config.gate_mode == "noninferiority" and _table_count(faithful, best) <= MAX_TABLES // 8:
        faithful_pass = verdict_rates(faithful, best, config).pass_rate
    return SampleSizePlan(scenario, power, alpha, best, fail_rate=hit, false_alarm=alarm, n_stable=stable,
                          faithful_pass=faithful_pass, checked=memo)


def _smallest_n(meets: Callable[[int], bool], n_max: int, run: int) -> tuple[int, int] | None:
    """(the smallest n that ``meets``, the n from which it holds ``run`` times in a row), or None up to n_max.

    Doubling finds an n that meets, bisection a boundary below it, a scan downward (until ``run`` n in a
    row fall short) the smallest, a scan upward the stable one: the rates are sawtooth curves in n."""
    hi = min(8, n_max)
    while not meets(hi):
        if hi >= n_max:
            return None
        hi = min(2 * hi, n_max)
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    best, misses, m = hi, 0, hi - 1
    while m >= 1 and misses < run:
        if meets(m):
            best, misses = m, 0
        else:
            misses += 1
        m -= 1
    stable, streak, m = hi, 0, hi
    while streak < run and m <= n_max:
        if meets(m):
            streak += 1
        else:
            stable, streak = m + 1, 0
        m += 1
    return best, stable


STRATA_RUN = 16
"""--solve-n with conversations: consecutive n checked past a candidate (each n costs two Monte Carlo runs)."""


def solve_n_strata(scenario: Scenario, multi_turn: MultiTurn, config: VerdictConfig = VerdictConfig(),
                   power: float = DEFAULT_POWER, alpha: float = DEFAULT_ALPHA, n_max: int = N_MAX,
                   runs: int = DEFAULT_RUNS, seed: int = 0) -> SampleSizePlan:
    """:func:`solve_n` with the conversations as a stratum of their own (the multi-turn gate included), by
    seeded Monte Carlo: the same ``runs`` and ``seed`` at every n, so the rates move smoothly with n (common
    random numbers) and the answer is within a few cases of the n where both estimates cross their targets.
    The faithful counterpart is faithful in both strata (lost = gained in each)."""
    if not 0 < power < 1 or not 0 < alpha < 1:
        raise ToolfidError("power and alpha must be in (0, 1)")
    conv = multi_turn.scenario
    if scenario.hallucinates or conv.hallucinates:
        raise ToolfidError("sample sizes are planned for the validity gate: give no hallucination rates")
    whole = _mixture(scenario, multi_turn)
    if whole.drop <= 0 and conv.drop <= 0:
        raise ToolfidError(f"drops of {scenario.drop:.3f} (single-turn) and {conv.drop:.3f} (multi-turn) are no "
                           "regression: give a drop > 0 in either")
    _check_n(n_max)
    for label, sc in (("single-turn", scenario), ("multi-turn", conv)):
        if sc.gained > sc.base_validity:
            raise ToolfidError(f"the faithful counterpart of the {label} cases (lost = gained = {sc.gained:.3f}) is "
                               f"impossible for a base validity of {sc.base_validity:.2f}: lower the gained share")
    faithful, faithful_multi = scenario.faithful(), MultiTurn(multi_turn.share, conv.faithful())
    reason = _strata_infeasible(scenario, multi_turn, config, power, alpha)
    if reason:
        return SampleSizePlan(scenario, power, alpha, None, reason=reason, multi_turn=multi_turn, runs=runs)
    memo: dict[int, tuple[float, float | None]] = {}

    def meets(n: int) -> bool:
        if n not in memo:
            hit = simulate_rates(scenario, n, config, runs, seed, multi_turn).fail_rate
            memo[n] = (hit, simulate_rates(faithful, n, config, runs, seed, faithful_multi).fail_rate
                       if hit >= power else None)
        hit, alarm = memo[n]
        return alarm is not None and hit >= power and alarm <= alpha

    found = _smallest_n(meets, n_max, STRATA_RUN)
    if found is None:
        return SampleSizePlan(scenario, power, alpha, None, checked=memo, multi_turn=multi_turn, runs=runs,
                              reason=f"not reached by n={n_max:,} (a drop close to the floor)")
    best, stable = found
    hit, alarm = memo[best]
    return SampleSizePlan(scenario, power, alpha, best, fail_rate=hit, false_alarm=alarm, n_stable=stable,
                          checked=memo, multi_turn=multi_turn, runs=runs)
