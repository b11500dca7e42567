"""Exact rates: sums over the multinomial tables of n cases, each decided by :func:`decide`'s gates.

:func:`verdict_rates` takes the discordant cells alone when they decide the verdict (point mode without
hallucination: fast for any n) and every table otherwise (the interval, the base and the hallucination
gates); tails of total mass below ``tol`` are left out and reported as ``missing``. :func:`fail_rate` is
P(FAIL) from the validity and base gates, :func:`grid` the rates over n × drop.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.scoring.power.binomial import _central, _log_factorials, _pmf, _pmf_rows, _pmf_zero, _split
from lm_eval_toolfid.scoring.power.decision import hallucination_unmeasured, validity_states
from lm_eval_toolfid.scoring.power.hallucination_odds import _HallucinationOdds
from lm_eval_toolfid.scoring.power.rates import VerdictRates, _check_n
from lm_eval_toolfid.scoring.power.scenario import DEFAULT_DISCORDANCE, Scenario, effective_n
from lm_eval_toolfid.scoring.power.tables import _blocks, _chunk
from lm_eval_toolfid.scoring.verdict import VerdictConfig

DEFAULT_TOL = 1e-12
"""Probability mass the exact sums may leave out (far tails of the multinomial), in total."""
MAX_TABLES = 40_000_000
"""Largest enumeration the exact tables path takes on (noninferiority mode, hallucination rates)."""


def _min_base_count(n: int, config: VerdictConfig) -> int:
    """The smallest count s with s / n ≥ min_base_validity, compared as ``judge`` compares it."""
    rates = np.arange(n + 1) / n
    return int(np.searchsorted(~(rates < config.min_base_validity), True))


def _discordant_rates(scenario: Scenario, n: int, config: VerdictConfig, tol: float) -> VerdictRates:
    """Point mode without hallucination: the verdict needs only the discordant cells and the base count.

    FAIL ⇔ base ok ∧ delta < floor, and delta needs only (lost, gained); the base count is
    n11 + n10 with n11 | K ~ Binomial(n − K, q), so P(base ok | K, n10) is a binomial tail. In either
    gate mode FAIL is exactly this event (the interval's lower bound never exceeds the point
    estimate), so :func:`solve_n` uses this path for noninferiority too.
    """
    pi11, pi10, pi01, pi00 = scenario.cells()
    lf = _log_factorials(n)
    p_k = _pmf(n, pi10 + pi01, lf)
    k_lo, k_hi = _central(p_k, tol / 2)
    ks = np.arange(k_lo, k_hi + 1)
    ks = ks[p_k[ks] > 0]
    share, q = _split(pi10, pi10 + pi01), _split(pi11, pi11 + pi00)
    a0, rows = _pmf_rows(ks, share, lf)  # rows[i, j] = P(n10 = a0 + j | K = ks[i])
    n10 = a0 + np.arange(rows.shape[1])[None, :]
    weight = p_k[ks][:, None] * rows
    s_min = _min_base_count(n, config)
    base_short = float(np.sum(_pmf(n, scenario.base_validity, lf)[:s_min]))  # P(base validity < min)
    skip_base = s_min == 0 or base_short <= tol / 4  # then every cell counts as base ok, within base_short
    p_ok = np.ones(weight.shape)
    if not skip_base:
        for i, k in enumerate(ks):
            upper = np.concatenate([np.cumsum(_pmf(n - k, q, lf)[::-1])[::-1], [0.0]])  # P(n11 ≥ j), j = 0..n−k+1
            p_ok[i] = upper[np.clip(s_min - n10[0], 0, n - k + 1)]
    delta = ((ks[:, None] - n10) - n10) / n
    vfail = delta < config.validity_delta_floor
    fail = float(np.sum(weight * p_ok * vfail))
    ok = float(np.sum(weight * p_ok))
    # tables where the hallucination gate is not measured (n11 = 0 and no valid call in a view it needs),
    # the base ok (n10 ≥ s_min when n11 = 0) and validity holding: UNDECIDED, not PASS
    stuck_cells = hallucination_unmeasured(ks[:, None] - n10, n10, config) & (n10 >= s_min) & ~vfail
    stuck = 0.0  # (n10 ≥ s_min is the base gate at n11 = 0, exact whether or not its tail is skipped above)
    if np.any(stuck_cells & (weight > 0)):  # only with settings that let such a table past the other gates
        m = (n - ks)[:, None]
        p_none = _pmf_zero(m, q)  # P(n11 = 0 | K)
        stuck = float(np.sum(weight * p_none * stuck_cells))
    kept = float(np.sum(weight))
    missing = max(0.0, 1.0 - kept) + (base_short if skip_base and s_min else 0.0)
    return VerdictRates(n=n, pass_rate=ok - fail - stuck, fail_rate=fail, undecided_rate=kept - ok + stuck,
                        method="exact", missing=missing, tables=int(np.count_nonzero(weight)))


def _table_rates(scenario: Scenario, n: int, config: VerdictConfig, tol: float) -> VerdictRates:
    """The general exact path: every table, the full rule (interval, base, hallucination)."""
    blocks = _blocks(scenario, n, tol)
    count = sum(b.size for b in blocks)
    if count > MAX_TABLES:
        raise ToolfidError(f"the exact sum needs {count:,} tables at n={n} (limit {MAX_TABLES:,}); "
                           "use Monte Carlo (--mc RUNS) or a smaller n")
    halluc = None
    if scenario.hallucinates:
        na = (min(b.b_lo + b.k - b.a_hi for b in blocks), max(b.b_hi + b.k - b.a_lo for b in blocks))
        nb = (min(b.b_lo + b.a_lo for b in blocks), max(b.b_hi + b.a_hi for b in blocks))
        halluc = _HallucinationOdds(scenario, config, n, tol, na, nb)
    passed = failed = undecided = 0.0
    for block in blocks:
        chunk = _chunk(block, n)
        base_ok, state = validity_states(chunk.n11, chunk.n10, chunk.n01, chunk.n00, config)
        if halluc is None:
            hfail, hhold = np.zeros(chunk.prob.shape), np.ones(chunk.prob.shape)
        else:
            hfail, hhold = halluc.odds(chunk.n11 + chunk.n01, chunk.n11 + chunk.n10)
        unmeasured = hallucination_unmeasured(chunk.n11 + chunk.n01, chunk.n11 + chunk.n10, config)
        hfail, hhold = np.where(unmeasured, 0.0, hfail), np.where(unmeasured, 0.0, hhold)
        w_ok = np.where(base_ok, chunk.prob, 0.0)
        failed += float(np.sum(w_ok * np.where(state == -1, 1.0, hfail)))
        passed += float(np.sum(w_ok * (state == 1) * hhold))
        undecided += float(np.sum(chunk.prob - w_ok) + np.sum(w_ok * (state == 0) * hhold)
                           + np.sum(w_ok * (state != -1) * unmeasured))
    kept = passed + failed + undecided
    return VerdictRates(n=n, pass_rate=passed, fail_rate=failed, undecided_rate=undecided, method="exact",
                        missing=max(0.0, 1.0 - kept), tables=count)


def verdict_rates(scenario: Scenario, n: int, config: VerdictConfig = VerdictConfig(),
                  tol: float = DEFAULT_TOL, method: Literal["auto", "tables", "discordant"] = "auto") -> VerdictRates:
    """Exact P(PASS), P(FAIL), P(UNDECIDED) of the verdict on ``n`` cases.

    ``auto`` sums over the discordant cells alone when that decides the verdict (point mode, no
    hallucination) and over whole tables otherwise; ``tests/test_power.py`` checks the two agree.
    """
    _check_n(n)
    if method == "discordant" or (method == "auto" and config.gate_mode == "point" and not scenario.hallucinates):
        if scenario.hallucinates or config.gate_mode != "point":
            raise ValueError("the discordant-cells path is for point mode without hallucination")
        return _discordant_rates(scenario, n, config, tol)
    return _table_rates(scenario, n, config, tol)


def fail_rate(scenario: Scenario, n: int, config: VerdictConfig = VerdictConfig(), tol: float = DEFAULT_TOL) -> float:
    """Exact P(FAIL) from the validity and base gates (hallucination left out); the same in both gate
    modes, since either FAILs exactly when delta < floor."""
    _check_n(n)
    point = config.model_copy(update={"gate_mode": "point"})
    return _discordant_rates(Scenario(scenario.base_validity, scenario.lost, scenario.gained), n, point, tol).fail_rate


def _table_count(scenario: Scenario, n: int, tol: float = DEFAULT_TOL) -> int:
    return sum(b.size for b in _blocks(scenario, n, tol))


def grid(base_validity: float, ns: Sequence[int], drops: Sequence[float], discordance: float = DEFAULT_DISCORDANCE,
         config: VerdictConfig = VerdictConfig(), halluc_base: float = 0.0, halluc_adapter: float = 0.0,
         design_effect: float = 1.0) -> list[list[VerdictRates]]:
    """Exact rates for every n (rows) × drop (columns); a drop adds to the faithful adapter's lost cases."""
    scenarios = [Scenario.with_drop(base_validity, d, discordance, halluc_base, halluc_adapter) for d in drops]
    return [[verdict_rates(s, effective_n(n, design_effect), config) for s in scenarios] for n in ns]
