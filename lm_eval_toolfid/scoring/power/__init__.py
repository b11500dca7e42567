"""How often is the verdict wrong? Its PASS / FAIL / UNDECIDED rates under the paired binomial model.

The model (docs/power.md): ``n`` independent cases, each expecting a call. A case's (base valid,
adapter valid) pair falls in one of four cells with probabilities

====================  ======================  =====================
\\                     adapter valid           adapter invalid
base valid            ``p - lost``            ``lost``
base invalid          ``gained``              ``1 - p - gained``
====================  ======================  =====================

``p`` is the base's validity, ``drop = lost - gained`` the adapter's net loss (a faithful adapter has
``lost == gained``, possibly > 0: cases change without a net change). Optionally each valid call
names a tool outside the declared surface with probability ``halluc_base`` / ``halluc_adapter``,
independently of everything else. Irrelevance cases (the false-call gate) and null calibrations (the
z gate) are outside the model.

Every decision is the real rule of :func:`lm_eval_toolfid.scoring.verdict.judge`:

- :func:`judge_table` is the plain path: it builds the table's :class:`PairScore` records, runs
  :func:`~lm_eval_toolfid.scoring.metrics.summarize` and ``judge``;
- :func:`decide` and the exact sums apply the same rule to whole arrays of tables at once (numpy),
  computing every compared number with the same floating-point operations as ``summarize``; an
  interval bound within 1e-9 of the floor is recomputed by the real
  :func:`~lm_eval_toolfid.core.stats.paired_difference_ci`. ``tests/test_power.py`` proves the two
  paths equal on every table with n ≤ 20 and n = 30 (and with hallucinated calls, n ≤ 8).

Rates come from exact sums over the multinomial tables (:func:`verdict_rates`; tails of total mass
below ``tol`` are left out and reported as ``missing``) or from a seeded Monte Carlo
(:func:`simulate_rates`, with standard errors). :func:`solve_n` and :func:`solve_drop` invert them.

The modules, lowest first (each imports only those above it):

- ``scenario``: :class:`Scenario`, :class:`MultiTurn` (conversations as a stratum), :func:`effective_n`;
- ``rates``: :class:`VerdictRates`, the answer of the rate computations;
- ``interval``: the verdict's 95% interval, vectorised over tables;
- ``decision``: the verdict on tables — :func:`judge_table` (plain) and :func:`decide` (vectorised);
- ``binomial``, ``tables``, ``hallucination_odds``: the pieces of the exact sums;
- ``exact``: :func:`verdict_rates`, :func:`fail_rate`, :func:`grid`;
- ``monte_carlo``: :func:`simulate_rates` and the draws behind it;
- ``limits``: where the rates go as n grows, and why a plan cannot be met;
- ``sample_size``: :func:`solve_n`, :func:`solve_n_strata`; ``detectable_drop``: :func:`solve_drop`.

This package re-exports every name the single module ``power`` had, so callers import from
``lm_eval_toolfid.scoring.power`` as before.
"""

from __future__ import annotations

from lm_eval_toolfid.scoring.power.decision import (
    FAIL,
    LABELS,
    PASS,
    UNDECIDED,
    decide,
    hallucination_unmeasured,
    judge_table,
    multiturn_fails,
    pairs_for_table,
    validity_states,
)
from lm_eval_toolfid.scoring.power.detectable_drop import DROP_STEP, DropPlan, solve_drop
from lm_eval_toolfid.scoring.power.exact import DEFAULT_TOL, MAX_TABLES, fail_rate, grid, verdict_rates
from lm_eval_toolfid.scoring.power.interval import Z95
from lm_eval_toolfid.scoring.power.limits import limit_fail_rate
from lm_eval_toolfid.scoring.power.monte_carlo import DEFAULT_RUNS, simulate_rates, simulate_strata, simulate_tables
from lm_eval_toolfid.scoring.power.rates import VerdictRates
from lm_eval_toolfid.scoring.power.sample_size import (
    DEFAULT_ALPHA,
    DEFAULT_POWER,
    N_MAX,
    STRATA_RUN,
    SampleSizePlan,
    solve_n,
    solve_n_strata,
)
from lm_eval_toolfid.scoring.power.scenario import DEFAULT_DISCORDANCE, MultiTurn, Scenario, effective_n

# the public names
__all__ = [
    "DEFAULT_ALPHA", "DEFAULT_DISCORDANCE", "DEFAULT_POWER", "DEFAULT_RUNS", "DEFAULT_TOL", "DROP_STEP", "FAIL",
    "LABELS", "MAX_TABLES", "N_MAX", "PASS", "STRATA_RUN", "UNDECIDED", "Z95", "DropPlan", "MultiTurn",
    "SampleSizePlan", "Scenario", "VerdictRates", "decide", "effective_n", "fail_rate", "grid",
    "hallucination_unmeasured", "judge_table", "limit_fail_rate", "multiturn_fails", "pairs_for_table",
    "simulate_rates", "simulate_strata", "simulate_tables", "solve_drop", "solve_n", "solve_n_strata",
    "validity_states", "verdict_rates",
]
