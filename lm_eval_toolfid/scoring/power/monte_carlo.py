"""Seeded Monte Carlo: random case sets (one stratum, or single-turn cases and conversations), decided by
:func:`decide`; rates with their standard errors."""

from __future__ import annotations

import math

import numpy as np

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.scoring.power.decision import FAIL, PASS, UNDECIDED, decide
from lm_eval_toolfid.scoring.power.rates import VerdictRates, _check_n
from lm_eval_toolfid.scoring.power.scenario import MultiTurn, Scenario
from lm_eval_toolfid.scoring.verdict import VerdictConfig

DEFAULT_RUNS = 20_000
"""Monte Carlo draws (standard error at most 0.0035)."""


def simulate_strata(scenario: Scenario, multi_turn: MultiTurn, n: int, runs: int,
                    seed: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """``runs`` random case sets of n cases, ``multi_turn.count(n)`` of them conversations: the tables
    (n11, n10, n01, n00, k_adapter, k_base) of the single-turn cases and of the conversations."""
    m = multi_turn.count(n)
    rng = np.random.Generator(np.random.PCG64(seed))

    def draw(sc: Scenario, size: int) -> tuple[np.ndarray, ...]:
        probs = np.array(sc.cells())
        n11, n10, n01, n00 = rng.multinomial(size, probs / probs.sum(), size=runs).T
        return n11, n10, n01, n00, rng.binomial(n11 + n01, sc.halluc_adapter), rng.binomial(n11 + n10, sc.halluc_base)

    return draw(scenario, n - m), draw(multi_turn.scenario, m)


def simulate_tables(scenario: Scenario, n: int, runs: int, seed: int) -> tuple[np.ndarray, ...]:
    """``runs`` random tables (n11, n10, n01, n00) and hallucinated counts (k_adapter, k_base)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    probs = np.array(scenario.cells())
    tables = rng.multinomial(n, probs / probs.sum(), size=runs)
    n11, n10, n01, n00 = tables.T
    k_a = rng.binomial(n11 + n01, scenario.halluc_adapter)
    k_b = rng.binomial(n11 + n10, scenario.halluc_base)
    return n11, n10, n01, n00, k_a, k_b


def simulate_rates(scenario: Scenario, n: int, config: VerdictConfig = VerdictConfig(), runs: int = DEFAULT_RUNS,
                   seed: int = 0, multi_turn: MultiTurn | None = None) -> VerdictRates:
    """Seeded Monte Carlo estimate of the whole compound verdict's rates, with standard errors.

    With ``multi_turn``, ``round(share · n)`` of the n cases are conversations drawn from its scenario (and
    gated on their own as well), the rest from ``scenario``."""
    _check_n(n)
    if runs < 1:
        raise ToolfidError(f"Monte Carlo needs at least one run (got {runs})")
    if multi_turn is None:
        n11, n10, n01, n00, k_a, k_b = simulate_tables(scenario, n, runs, seed)
        labels = decide(n11, n10, n01, n00, config, k_a, k_b)
    else:
        single, conv = simulate_strata(scenario, multi_turn, n, runs, seed)
        n11, n10, n01, n00, k_a, k_b = (s + m for s, m in zip(single, conv))
        labels = decide(n11, n10, n01, n00, config, k_a, k_b, multi=conv[:4])
    rates = [float(np.mean(labels == code)) for code in (PASS, FAIL, UNDECIDED)]
    se = tuple(math.sqrt(r * (1 - r) / runs) for r in rates)
    return VerdictRates(n=n, pass_rate=rates[0], fail_rate=rates[1], undecided_rate=rates[2], method="monte carlo",
                        se=se, runs=runs)  # type: ignore[arg-type]
