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
"""

from __future__ import annotations

import inspect
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Outcome, OutcomeKind, PairScore
from lm_eval_toolfid.core.stats import TANGO_ITERATIONS, paired_difference_ci
from lm_eval_toolfid.scoring.metrics import summarize
from lm_eval_toolfid.scoring.verdict import MIN_GATE_N, Verdict, VerdictConfig, judge

PASS, FAIL, UNDECIDED = 0, 1, 2
"""Label codes of :func:`decide`'s arrays."""
LABELS = ("PASS", "FAIL", "UNDECIDED")

DEFAULT_TOL = 1e-12
"""Probability mass the exact sums may leave out (far tails of the multinomial), in total."""
DEFAULT_RUNS = 20_000
"""Monte Carlo draws (standard error at most 0.0035)."""
DEFAULT_DISCORDANCE = 0.04
"""Planning default: a faithful adapter changes 4% of cases (2% lost, 2% gained). Measure your own:
(lost + gained) / n of ``validity_discordant`` in a faithful adapter's results."""
DEFAULT_POWER = 0.8
DEFAULT_ALPHA = 0.05
N_MAX = 100_000
"""Largest n :func:`solve_n` searches."""
MAX_TABLES = 40_000_000
"""Largest enumeration the exact tables path takes on (noninferiority mode, hallucination rates)."""
Z95: float = inspect.signature(paired_difference_ci).parameters["z"].default
"""The z of the verdict's 95% interval: :func:`paired_difference_ci`'s own default."""
_BORDER = 1e-9
"""An interval bound this close to the floor is recomputed by the real function."""


# --- the model ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    """One adapter under the paired binomial model (rates per case; see the module docstring)."""

    base_validity: float
    lost: float = 0.0
    gained: float = 0.0
    halluc_base: float = 0.0
    halluc_adapter: float = 0.0

    def __post_init__(self) -> None:
        for name in ("base_validity", "lost", "gained", "halluc_base", "halluc_adapter"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise ToolfidError(f"{name} must be a rate in [0, 1] (got {value!r})")
        p = self.base_validity
        if self.lost > p + 1e-12:
            raise ToolfidError(f"cases lost ({self.lost:.3f}) cannot exceed the base validity ({p:.3f}): "
                               "only cases the base gets right can be lost")
        if self.gained > 1 - p + 1e-12:
            raise ToolfidError(f"cases gained ({self.gained:.3f}) cannot exceed the base's invalid share "
                               f"({1 - p:.3f}): only cases the base gets wrong can be gained")

    @classmethod
    def with_drop(cls, base_validity: float, drop: float, discordance: float = DEFAULT_DISCORDANCE,
                  halluc_base: float = 0.0, halluc_adapter: float = 0.0) -> Scenario:
        """A faithful adapter's churn (``discordance`` split evenly: lost = gained = discordance / 2)
        plus a net loss ``drop`` on top of it (lost = discordance / 2 + drop)."""
        for name, value in (("drop", drop), ("discordance", discordance)):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ToolfidError(f"{name} must be a number (got {value!r})")
        if not 0.0 <= discordance <= 1.0:
            raise ToolfidError(f"discordance must be a rate in [0, 1] (got {discordance!r})")
        lost, gained = discordance / 2 + drop, discordance / 2
        if lost < -1e-12:
            raise ToolfidError(f"a gain of {-drop:.3f} is more than the cases a faithful adapter with discordance "
                               f"{discordance:.3f} loses ({gained:.3f}): give --lost and --gained")
        return cls(base_validity, max(lost, 0.0), gained, halluc_base, halluc_adapter)

    @property
    def drop(self) -> float:
        return self.lost - self.gained

    @property
    def discordance(self) -> float:
        return self.lost + self.gained

    @property
    def hallucinates(self) -> bool:
        return self.halluc_base > 0 or self.halluc_adapter > 0

    def cells(self) -> tuple[float, float, float, float]:
        """Probabilities of (both valid, lost, gained, neither valid)."""
        p, l, g = self.base_validity, self.lost, self.gained
        return (max(p - l, 0.0), l, g, max(1.0 - p - g, 0.0))

    def faithful(self) -> Scenario:
        """The same adapter without its net loss: lost = gained, the same hallucination as the base."""
        return Scenario(self.base_validity, self.gained, self.gained, self.halluc_base, self.halluc_base)

    def as_record(self) -> dict[str, float]:
        return {**asdict(self), "drop": self.drop, "discordance": self.discordance}

    def describe(self) -> str:
        text = f"base {self.base_validity:.2f}, drop {self.drop:.3f} (lost {self.lost:.3f}, gained {self.gained:.3f})"
        if self.hallucinates:
            text += f", hallucination {self.halluc_base:.3f} → {self.halluc_adapter:.3f}"
        return text


@dataclass(frozen=True)
class VerdictRates:
    """P(PASS), P(FAIL), P(UNDECIDED) of the verdict for ``n`` cases."""

    n: int
    pass_rate: float
    fail_rate: float
    undecided_rate: float
    method: Literal["exact", "monte carlo"]
    missing: float = 0.0
    """Exact: each rate is within this of its exact value (the far tails left out of the sums)."""
    se: tuple[float, float, float] | None = None
    """Monte Carlo: the standard errors of the three rates."""
    runs: int | None = None
    tables: int | None = None
    """Exact: how many 2×2 tables (or discordant cells) were summed."""

    def rate(self, label: str) -> float:
        return {"PASS": self.pass_rate, "FAIL": self.fail_rate, "UNDECIDED": self.undecided_rate}[label]

    def as_record(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class MultiTurn:
    """The conversations of a case set (turn depth ≥ 2) as a stratum of their own: a ``share`` of the cases
    expecting a call, with their own rates. The verdict gates them separately (the multi-turn gate), which a
    single stratum cannot model: an adapter that loses conversations can FAIL while its whole-set drop is
    small. With it, :func:`simulate_rates` draws ``round(share · n)`` conversations per case set, the rest
    from the main (single-turn) scenario."""

    share: float
    scenario: Scenario

    def __post_init__(self) -> None:
        if not isinstance(self.share, (int, float)) or not math.isfinite(self.share) or not 0.0 <= self.share <= 1.0:
            raise ToolfidError(f"the multi-turn share must be in [0, 1] (got {self.share!r})")

    def count(self, n: int) -> int:
        return int(round(self.share * n))

    def as_record(self) -> dict[str, Any]:
        return {"share": self.share, **self.scenario.as_record()}

    def describe(self) -> str:
        return f"multi-turn {self.share:.0%} of cases: {self.scenario.describe()}"


# --- the decision on tables ----------------------------------------------------------------------

_VALID = Outcome(kind=OutcomeKind.VALID, hallucinated=False)
_VALID_HALLUCINATED = Outcome(kind=OutcomeKind.VALID, hallucinated=True)
_INVALID = Outcome(kind=OutcomeKind.NO_CALL)


def pairs_for_table(n11: int, n10: int, n01: int, n00: int, k_adapter: int = 0, k_base: int = 0,
                    turn_depth: int = 1, prefix: str = "") -> list[PairScore]:
    """Case records of a table: n11 valid in both views, n10 lost, n01 gained, n00 invalid in both;
    ``k_adapter`` of the adapter's valid calls and ``k_base`` of the base's name an undeclared tool;
    every case at ``turn_depth`` (2: conversations), ids ``prefix`` + index."""
    if min(n11, n10, n01, n00, k_adapter, k_base) < 0:
        raise ValueError("table counts must be ≥ 0")
    if k_adapter > n11 + n01 or k_base > n11 + n10:
        raise ValueError("more hallucinated calls than valid ones")
    cells = [(True, True)] * n11 + [(True, False)] * n10 + [(False, True)] * n01 + [(False, False)] * n00
    pairs, seen_ft, seen_base = [], 0, 0
    for i, (base_valid, ft_valid) in enumerate(cells):
        ft = base = _INVALID
        if ft_valid:
            ft = _VALID_HALLUCINATED if seen_ft < k_adapter else _VALID
            seen_ft += 1
        if base_valid:
            base = _VALID_HALLUCINATED if seen_base < k_base else _VALID
            seen_base += 1
        pairs.append(PairScore(case_id=f"{prefix}{i}", ft=ft, base=base, turn_depth=turn_depth))
    return pairs


def judge_table(n11: int, n10: int, n01: int, n00: int, config: VerdictConfig = VerdictConfig(),
                k_adapter: int = 0, k_base: int = 0) -> Verdict:
    """The plain path: the verdict ``toolfid`` gives a run whose cases make this table."""
    return judge(summarize(pairs_for_table(n11, n10, n01, n00, k_adapter, k_base)), config)


def _tango_low(n10: np.ndarray, n01: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Lower limit of :func:`paired_difference_ci` (Tango's score interval, adapter − base), vectorised
    over tables: the same bisection with the same floating-point operations as
    :func:`lm_eval_toolfid.core.stats.tango_limits`."""
    return _tango_limit(n10, n01, n, upper=False)


def _tango_high(n10: np.ndarray, n01: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Upper limit of the same interval, vectorised the same way."""
    return _tango_limit(n10, n01, n, upper=True)


def _tango_limit(n10: np.ndarray, n01: np.ndarray, n: np.ndarray, upper: bool) -> np.ndarray:
    target = -Z95 if upper else Z95
    lost, gained, n = (np.asarray(x, dtype=np.float64) for x in (n10, n01, n))
    lo = np.full(np.broadcast(lost, gained, n).shape, -1.0)
    hi = np.full(lo.shape, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(TANGO_ITERATIONS):
            mid = (lo + hi) / 2
            b = -gained - lost + (2 * n - gained + lost) * mid
            c = -lost * mid * (1 - mid)
            p_lost = (np.sqrt(np.maximum(0.0, b * b - 8 * n * c)) - b) / (4 * n)
            num = gained - lost - n * mid
            var = n * (2 * p_lost + mid * (1 - mid))
            stat = np.where(num == 0, 0.0, np.where(var > 0, num / np.sqrt(np.where(var > 0, var, 1.0)),
                                                    np.copysign(np.inf, num)))
            above = stat > target
            lo = np.where(above, mid, lo)
            hi = np.where(above, hi, mid)
    estimate = (gained - lost) / n
    if upper:
        return np.minimum(1.0, np.maximum(np.where(estimate == 1, 1.0, (lo + hi) / 2), estimate))
    low = np.where(estimate == -1, -1.0, (lo + hi) / 2)
    return np.maximum(-1.0, np.minimum(low, estimate))


def _real_low(n11: int, n10: int, n01: int, n00: int, upper: bool = False) -> float:
    """The real function's lower (or upper) bound, fed exactly what ``summarize`` feeds it."""
    deltas = [0] * n11 + [-1] * n10 + [1] * n01 + [0] * n00
    base_valid = [1] * (n11 + n10) + [0] * (n01 + n00)
    ci = paired_difference_ci(deltas, base_valid)
    assert ci is not None
    return ci[1] if upper else ci[0]


def multiturn_fails(m11: Any, m10: Any, m01: Any, m00: Any, config: VerdictConfig) -> np.ndarray:
    """Per table of conversations: the verdict's multi-turn gate fails — at least ``MIN_GATE_N`` of them, a
    base valid on ≥ ``min_base_validity`` of them, the drop below the floor and the whole 95% interval too
    (a subset gate fails only when the failure is statistically clear)."""
    m11, m10, m01, m00 = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (m11, m10, m01, m00)))
    m = m11 + m10 + m01 + m00
    floor = config.validity_delta_floor
    with np.errstate(divide="ignore", invalid="ignore"):
        applies = (m >= MIN_GATE_N) & ~((m11 + m10) / np.maximum(m, 1) < config.min_base_validity)
        delta = np.where(m > 0, (m01 - m10) / np.maximum(m, 1), 0.0)
    high = np.ones(m.shape)
    some = np.flatnonzero((applies & (delta < floor)).ravel())
    if some.size:
        flat = [x.ravel() for x in (m11, m10, m01, m00)]
        rows = [x[some] for x in flat]
        limits = _tango_high(rows[1], rows[2], rows[0] + rows[1] + rows[2] + rows[3])
        for j in np.flatnonzero(np.abs(limits - floor) <= _BORDER):
            limits[j] = _real_low(*(int(x[j]) for x in rows), upper=True)
        high = high.ravel()
        high[some] = limits
        high = high.reshape(m.shape)
    return applies & (delta < floor) & (high < floor)


def validity_states(n11: np.ndarray, n10: np.ndarray, n01: np.ndarray, n00: np.ndarray,
                    config: VerdictConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per table: (base validity ≥ min_base_validity, validity gate: 1 pass, 0 undecided, −1 fail)."""
    n11, n10, n01, n00 = (np.asarray(x, dtype=np.int64) for x in (n11, n10, n01, n00))
    n = n11 + n10 + n01 + n00
    if np.any(n < 1):
        raise ValueError("every table needs at least one case")
    base_ok = ~((n11 + n10) / n < config.min_base_validity)
    delta = (n01 - n10) / n
    floor = config.validity_delta_floor
    if config.gate_mode == "point":
        state = np.where(delta < floor, -1, 1).astype(np.int8)
        return base_ok, state
    low = _tango_low(n10, n01, n)
    near = np.flatnonzero(np.abs(low - floor) <= _BORDER)
    if near.size:
        flat = [np.broadcast_to(x, low.shape).ravel() for x in (n11, n10, n01, n00)]
        low = low.copy().ravel()
        for i in near:
            low[i] = _real_low(*(int(x[i]) for x in flat))
        low = low.reshape(np.shape(delta))
    state = np.where(low >= floor, 1, np.where(delta < floor, -1, 0)).astype(np.int8)
    return base_ok, state


def hallucination_unmeasured(n_a: Any, n_b: Any, config: VerdictConfig) -> np.ndarray:
    """Per table: the hallucination gate is *not measured* — its rate is undefined because the adapter made
    no valid call (n_a = 0) or, for the delta, the base made none (n_b = 0). ``judge`` then cannot decide
    that gate: the verdict is UNDECIDED unless another gate fails."""
    missing = np.asarray(n_a) == 0
    if config.hallucination_gate != "absolute":
        missing = missing | (np.asarray(n_b) == 0)
    return missing


def _hallucination_fails(n_a: np.ndarray, n_b: np.ndarray, k_a: np.ndarray, k_b: np.ndarray,
                         config: VerdictConfig) -> np.ndarray:
    """The hallucination gate fails (only where it is measured: see :func:`hallucination_unmeasured`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate_a = np.where(n_a > 0, k_a / np.maximum(n_a, 1), 0.0)
        rate_b = np.where(n_b > 0, k_b / np.maximum(n_b, 1), 0.0)
    value = rate_a if config.hallucination_gate == "absolute" else rate_a - rate_b
    return ~hallucination_unmeasured(n_a, n_b, config) & (value > config.hallucination_cap)


def decide(n11: Any, n10: Any, n01: Any, n00: Any, config: VerdictConfig = VerdictConfig(),
           k_adapter: Any = None, k_base: Any = None, multi: tuple[Any, Any, Any, Any] | None = None) -> np.ndarray:
    """The verdict of every table at once: an array of :data:`PASS`, :data:`FAIL`, :data:`UNDECIDED`.

    ``k_adapter`` / ``k_base``: hallucinated valid calls per table (None: none). ``multi``: the tables of
    the conversations among the cases (m11, m10, m01, m00 — already counted in n11…n00), for the
    multi-turn gate (None: a case set without conversations).
    """
    n11, n10, n01, n00 = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (n11, n10, n01, n00)))
    base_ok, state = validity_states(n11, n10, n01, n00, config)
    hfail = np.zeros(n11.shape, dtype=bool)
    if k_adapter is not None or k_base is not None:
        k_a = np.broadcast_to(np.asarray(0 if k_adapter is None else k_adapter, dtype=np.int64), n11.shape)
        k_b = np.broadcast_to(np.asarray(0 if k_base is None else k_base, dtype=np.int64), n11.shape)
        hfail = _hallucination_fails(n11 + n01, n11 + n10, k_a, k_b, config)
    if multi is not None:
        hfail = hfail | multiturn_fails(*(np.broadcast_to(np.asarray(x, dtype=np.int64), n11.shape) for x in multi),
                                        config)
    unmeasured = hallucination_unmeasured(n11 + n01, n11 + n10, config)
    label = np.where(state == -1, FAIL, np.where(hfail, FAIL, np.where((state == 0) | unmeasured, UNDECIDED, PASS)))
    return np.where(base_ok, label, UNDECIDED).astype(np.int8)


# --- binomial pieces -----------------------------------------------------------------------------

_LOG_FACTORIALS = np.zeros(1)


def _log_factorials(n: int) -> np.ndarray:
    """log(k!) for k = 0..n (at least), grown on demand and kept."""
    global _LOG_FACTORIALS
    if len(_LOG_FACTORIALS) <= n:
        size = max(n + 1, 2 * len(_LOG_FACTORIALS))
        _LOG_FACTORIALS = np.array([math.lgamma(k + 1) for k in range(size)])
    return _LOG_FACTORIALS


def _pmf(m: int, q: float, lf: np.ndarray) -> np.ndarray:
    """Binomial(m, q) probabilities of 0..m, normalised to sum to 1."""
    out = np.zeros(m + 1)
    if q <= 0.0:
        out[0] = 1.0
        return out
    if q >= 1.0:
        out[m] = 1.0
        return out
    k = np.arange(m + 1)
    logp = lf[m] - lf[k] - lf[m - k] + k * math.log(q) + (m - k) * math.log1p(-q)
    out = np.exp(logp - logp.max())
    return out / out.sum()


def _central(pmf: np.ndarray, tail: float) -> tuple[int, int]:
    """The smallest index range [lo, hi] leaving at most ``tail`` of the mass on either side."""
    lo = int(np.searchsorted(np.cumsum(pmf), tail, side="right"))
    hi = len(pmf) - 1 - int(np.searchsorted(np.cumsum(pmf[::-1]), tail, side="right"))
    return min(lo, hi), max(lo, hi)


def _split(s: float, total: float) -> float:
    return s / total if total > 0 else 0.0


def _min_base_count(n: int, config: VerdictConfig) -> int:
    """The smallest count s with s / n ≥ min_base_validity, compared as ``judge`` compares it."""
    rates = np.arange(n + 1) / n
    return int(np.searchsorted(~(rates < config.min_base_validity), True))


# --- exact sums ----------------------------------------------------------------------------------

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


def _pmf_zero(m: np.ndarray, q: float) -> np.ndarray:
    """P(X = 0) for X ~ Binomial(m, q), per m: (1 − q)^m."""
    if q >= 1.0:
        return (m == 0).astype(float)
    return np.exp(m * math.log1p(-q)) if q > 0.0 else np.ones(np.shape(m))


def _pmf_rows(ms: np.ndarray, q: float, lf: np.ndarray) -> tuple[int, np.ndarray]:
    """Binomial(m, q) probabilities for every m in ``ms`` (rows) over one window of counts a0, a0 + 1, …
    wide enough that each row leaves out less than 1e-20 (rows normalised over the window)."""
    ms = np.asarray(ms, dtype=np.int64)
    if len(ms) == 0:
        return 0, np.zeros((0, 1))
    if q <= 0.0 or q >= 1.0:
        a0 = 0 if q <= 0.0 else int(ms.min())
        width = 1 if q <= 0.0 else int(ms.max() - ms.min()) + 1
        rows = np.zeros((len(ms), width))
        rows[np.arange(len(ms)), 0 if q <= 0.0 else ms - a0] = 1.0
        return a0, rows
    spread = 10 * math.sqrt(ms.max() * q * (1 - q)) + 12
    a0 = max(0, int(math.floor(ms.min() * q - spread)))
    a1 = min(int(ms.max()), int(math.ceil(ms.max() * q + spread)))
    a = np.arange(a0, a1 + 1)[None, :]
    m = ms[:, None]
    inside = a <= m
    safe = np.where(inside, m - a, 0)
    logp = lf[m] - lf[a] - lf[safe] + a * math.log(q) + safe * math.log1p(-q)
    logp = np.where(inside, logp, -np.inf)
    rows = np.exp(logp - logp.max(axis=1, keepdims=True))
    return a0, rows / rows.sum(axis=1, keepdims=True)


@dataclass
class _Chunk:
    n11: np.ndarray
    n10: np.ndarray
    n01: np.ndarray
    n00: np.ndarray
    prob: np.ndarray


@dataclass(frozen=True)
class _Block:
    """The kept tables of one discordant count K: n10 in [a_lo, a_hi] × n11 in [b_lo, b_hi]."""

    k: int
    p_k: float
    p_a: np.ndarray
    a_lo: int
    a_hi: int
    p_b: np.ndarray
    b_lo: int
    b_hi: int

    @property
    def size(self) -> int:
        return (self.a_hi - self.a_lo + 1) * (self.b_hi - self.b_lo + 1)


def _blocks(scenario: Scenario, n: int, tol: float) -> list[_Block]:
    """The multinomial tables, factored: K ~ Bin(n, lost + gained); n10 | K ~ Bin(K, lost / (lost +
    gained)); n11 | K ~ Bin(n − K, (p − lost) / (1 − lost − gained)), independent of n10. Each of the
    three levels leaves out tails of at most ``tol`` / 3."""
    pi11, pi10, pi01, pi00 = scenario.cells()
    lf = _log_factorials(n)
    p_k = _pmf(n, pi10 + pi01, lf)
    k_lo, k_hi = _central(p_k, tol / 6)
    share, q = _split(pi10, pi10 + pi01), _split(pi11, pi11 + pi00)
    out = []
    for k in range(k_lo, k_hi + 1):
        if p_k[k] == 0.0:
            continue
        p_a, p_b = _pmf(k, share, lf), _pmf(n - k, q, lf)
        (a_lo, a_hi), (b_lo, b_hi) = _central(p_a, tol / 6), _central(p_b, tol / 6)
        out.append(_Block(k, float(p_k[k]), p_a[a_lo:a_hi + 1], a_lo, a_hi, p_b[b_lo:b_hi + 1], b_lo, b_hi))
    return out


def _chunk(block: _Block, n: int) -> _Chunk:
    n10 = np.arange(block.a_lo, block.a_hi + 1)[:, None]
    n11 = np.arange(block.b_lo, block.b_hi + 1)[None, :]
    prob = block.p_k * block.p_a[:, None] * block.p_b[None, :]
    n10, n11 = np.broadcast_arrays(n10, n11)
    return _Chunk(n11=n11.ravel(), n10=n10.ravel(), n01=(block.k - n10).ravel(), n00=(n - block.k - n11).ravel(),
                  prob=prob.ravel())


class _HallucinationOdds:
    """P(the hallucination gate fails), P(it holds) | the adapter's n_a and the base's n_b valid calls,
    for k_a ~ Bin(n_a, halluc_adapter) and k_b ~ Bin(n_b, halluc_base) independent, on a dense grid of
    (n_a, n_b). The comparison is the one ``judge`` makes (rate_a − rate_b > cap, in floating point);
    k_b's tails of at most ``tol`` are left out, so fail + hold ≥ 1 − tol."""

    def __init__(self, scenario: Scenario, config: VerdictConfig, n: int, tol: float,
                 na_range: tuple[int, int], nb_range: tuple[int, int]) -> None:
        self.config = config
        self.na0, self.nb0 = na_range[0], nb_range[0]
        lf = _log_factorials(n)
        n_bs = np.arange(nb_range[0], nb_range[1] + 1)
        kb, pb, rb = self._base_grid(scenario.halluc_base, n_bs, lf, tol)
        self.fail = np.zeros((na_range[1] - na_range[0] + 1, len(n_bs)))
        self.hold = np.ones_like(self.fail)
        for row, n_a in enumerate(range(na_range[0], na_range[1] + 1)):
            if n_a == 0:  # no valid adapter call: the gate is not measured (_table_rates masks it)
                continue
            pmf_a = _pmf(n_a, scenario.halluc_adapter, lf)
            upper = np.concatenate([np.cumsum(pmf_a[::-1])[::-1], [0.0]])  # P(k_a ≥ j), j = 0..n_a+1
            lower = np.concatenate([[0.0], np.cumsum(pmf_a)])  # P(k_a ≤ j − 1), j = 0..n_a+1
            rates = np.arange(n_a + 1) / n_a
            if config.hallucination_gate == "absolute":
                j = self._first_failing(rates, np.zeros(1))[0]
                self.fail[row], self.hold[row] = upper[j], lower[j]
            else:
                j = self._first_failing(rates, rb)
                self.fail[row], self.hold[row] = (pb * upper[j]).sum(axis=1), (pb * lower[j]).sum(axis=1)

    @staticmethod
    def _base_grid(h: float, n_bs: np.ndarray, lf: np.ndarray, tol: float) -> tuple[np.ndarray, ...]:
        """Per n_b: the kept k_b values, their probabilities and rates k_b / n_b (0 for n_b = 0), padded."""
        rows = []
        for n_b in n_bs:
            pmf = _pmf(int(n_b), h, lf)
            lo, hi = _central(pmf, tol / 2)
            rows.append((np.arange(lo, hi + 1), pmf[lo:hi + 1]))
        width = max(len(k) for k, _ in rows)
        kb = np.zeros((len(n_bs), width), dtype=np.int64)
        pb = np.zeros((len(n_bs), width))
        for i, (k, p) in enumerate(rows):
            kb[i, :len(k)], pb[i, :len(k)] = k, p
        column = n_bs[:, None]
        rb = np.where(column > 0, kb / np.maximum(column, 1), 0.0)
        return kb, pb, rb

    def _first_failing(self, rates: np.ndarray, rb: np.ndarray) -> np.ndarray:
        """Per base rate: the smallest k_a with rates[k_a] − rb > cap (len(rates) when none)."""
        cap, top = self.config.hallucination_cap, len(rates)

        def fails(idx: np.ndarray) -> np.ndarray:
            return (idx >= 0) & (idx < top) & (rates[np.clip(idx, 0, top - 1)] - rb > cap)

        j = np.searchsorted(rates, cap + rb, side="right")
        for _ in range(3):  # the guess compares rates > cap + rb; the rule is rates − rb > cap
            j = np.where((j > 0) & fails(j - 1), j - 1, j)
            j = np.where((j < top) & ~fails(j), j + 1, j)
        if not (np.all((j == top) | fails(j)) and np.all((j == 0) | ~fails(j - 1))):
            raise RuntimeError("hallucination threshold search did not converge")
        return j

    def odds(self, n_a: np.ndarray, n_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = (n_a - self.na0, n_b - self.nb0)
        return self.fail[at], self.hold[at]


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


# --- Monte Carlo ---------------------------------------------------------------------------------

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


# --- planning: the inverse questions -------------------------------------------------------------

def effective_n(n: int, design_effect: float = 1.0) -> int:
    """Cases that count as independent when correlated cases inflate the variance by ``design_effect``."""
    if not math.isfinite(design_effect) or design_effect < 1.0:
        raise ToolfidError(f"the design effect must be ≥ 1 (got {design_effect!r})")
    return max(1, round(n / design_effect))


def limit_fail_rate(scenario: Scenario, config: VerdictConfig) -> float:
    """Where P(FAIL) goes as n grows: 0, 1, or about ½ when a rate sits exactly on its threshold."""

    def side(value: float, threshold: float, variable: bool) -> float:
        if abs(value - threshold) <= 1e-12:
            return 0.5 if variable else 0.0
        return 1.0 if value > threshold else 0.0

    p = scenario.base_validity
    base = _limit_base_ok(p, config)
    validity = side(scenario.drop, -config.validity_delta_floor, scenario.discordance > 0)
    halluc = 0.0
    if p - scenario.drop > 0 and scenario.hallucinates:
        value = scenario.halluc_adapter - (0 if config.hallucination_gate == "absolute" else scenario.halluc_base)
        halluc = side(value, config.hallucination_cap, 0 < scenario.halluc_adapter < 1)
    return base * (1 - (1 - validity) * (1 - halluc))


def _limit_base_ok(p: float, config: VerdictConfig) -> float:
    """Where P(base validity ≥ min_base_validity) goes as n grows."""
    mb = config.min_base_validity
    if p > mb + 1e-12 or mb == 0:
        return 1.0
    if abs(p - mb) <= 1e-12:
        return 1.0 if p in (0.0, 1.0) else 0.5  # exactly on the threshold: certain only without variance
    return 0.0


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


def _mixture(scenario: Scenario, multi_turn: MultiTurn) -> Scenario:
    """The whole case set's rates: the two strata weighted by their shares."""
    s, conv = multi_turn.share, multi_turn.scenario

    def mix(a: float, b: float) -> float:
        return (1 - s) * a + s * b

    return Scenario(mix(scenario.base_validity, conv.base_validity), mix(scenario.lost, conv.lost),
                    mix(scenario.gained, conv.gained))


def _strata_infeasible(scenario: Scenario, multi_turn: MultiTurn, config: VerdictConfig, power: float,
                       alpha: float) -> str:
    """Why no n can meet the targets, from the rates' limits as n grows (empty when some n may)."""
    whole, conv = _mixture(scenario, multi_turn), multi_turn.scenario
    has_conv = multi_turn.share > 0

    def limit(whole_sc: Scenario, conv_sc: Scenario) -> float:
        """P(FAIL) as n grows: the base gate of the whole set, then its validity gate or the conversations'
        (whose own base gate only switches theirs off)."""
        base = _limit_base_ok(whole_sc.base_validity, config)
        if base == 0:
            return 0.0
        gates = limit_fail_rate(whole_sc, config) / base
        conv_fail = limit_fail_rate(conv_sc, config) if has_conv else 0.0
        return base * (1 - (1 - gates) * (1 - conv_fail))

    if whole.base_validity < config.min_base_validity:
        return (f"the base's validity {whole.base_validity:.2f} is below min_base_validity "
                f"{config.min_base_validity:.2f}: every verdict is UNDECIDED")
    if limit(whole, conv) < power:
        return (f"FAIL needs the observed drop of the whole set or of the conversations to exceed "
                f"{-config.validity_delta_floor:.3f}; drops of {whole.drop:.3f} (whole set) and {conv.drop:.3f} "
                f"(conversations) do not reach {power:.0%} at any n")
    if limit(_mixture(scenario.faithful(), MultiTurn(multi_turn.share, conv.faithful())), conv.faithful()) > alpha:
        return (f"at floor {config.validity_delta_floor:+.3f} a faithful adapter fails about half the time at any n; "
                "use a floor below 0")
    return ""


def _table_count(scenario: Scenario, n: int, tol: float = DEFAULT_TOL) -> int:
    return sum(b.size for b in _blocks(scenario, n, tol))


def _infeasible(scenario: Scenario, faithful: Scenario, config: VerdictConfig, power: float, alpha: float) -> str:
    floor = config.validity_delta_floor
    if scenario.base_validity < config.min_base_validity:
        return (f"the base's validity {scenario.base_validity:.2f} is below min_base_validity "
                f"{config.min_base_validity:.2f}: every verdict is UNDECIDED")
    if limit_fail_rate(scenario, config) < power:
        suggestion = -round(scenario.drop / 2, 3) or -0.001
        return (f"FAIL needs the observed drop to exceed {-floor:.3f} (in either gate mode), so P(FAIL) for a drop of "
                f"{scenario.drop:.3f} does not reach {power:.0%} at any n; a floor above {-scenario.drop:.3f} "
                f"would (e.g. --floor {suggestion:g})")
    if limit_fail_rate(faithful, config) > alpha:
        return (f"at floor {floor:+.3f} a faithful adapter with discordance {faithful.discordance:.3f} fails about "
                "half the time at any n; use a floor below 0")
    return ""


@dataclass(frozen=True)
class DropPlan:
    """The answer of :func:`solve_drop`: the smallest drop (on a 0.001 grid) caught with the given power."""

    base_validity: float
    n: int
    discordance: float
    power: float
    drop: float | None
    fail_rate: float | None = None
    false_alarm: float = 0.0
    """P(FAIL) of the faithful adapter (drop 0) at this n."""
    reason: str = ""


DROP_STEP = 0.001


def solve_drop(base_validity: float, n: int, discordance: float = DEFAULT_DISCORDANCE,
               config: VerdictConfig = VerdictConfig(), power: float = DEFAULT_POWER) -> DropPlan:
    """The smallest drop (a multiple of 0.001) whose P(FAIL) at ``n`` cases is ≥ ``power``.

    P(FAIL) grows with the drop (more lost cases, the same gained ones), so bisection finds it.
    """
    _check_n(n)
    if not 0 < power < 1:
        raise ToolfidError("power must be in (0, 1)")
    faithful = Scenario.with_drop(base_validity, 0.0, discordance)
    alarm = fail_rate(faithful, n, config)
    top = int(math.floor((base_validity - discordance / 2) / DROP_STEP + 1e-9))

    def caught(i: int) -> float:
        return fail_rate(Scenario.with_drop(base_validity, i * DROP_STEP, discordance), n, config)

    if top < 1 or caught(top) < power:
        return DropPlan(base_validity, n, discordance, power, None, false_alarm=alarm,
                        reason=f"even losing every case the base gets right is caught less than {power:.0%} "
                               f"of the time at n={n}" if top >= 1 else "the base has no valid case to lose")
    lo, hi = 0, top
    if alarm >= power:
        hi = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if caught(mid) >= power:
            hi = mid
        else:
            lo = mid
    return DropPlan(base_validity, n, discordance, power, round(hi * DROP_STEP, 3), fail_rate=caught(hi),
                    false_alarm=alarm)


def grid(base_validity: float, ns: Sequence[int], drops: Sequence[float], discordance: float = DEFAULT_DISCORDANCE,
         config: VerdictConfig = VerdictConfig(), halluc_base: float = 0.0, halluc_adapter: float = 0.0,
         design_effect: float = 1.0) -> list[list[VerdictRates]]:
    """Exact rates for every n (rows) × drop (columns); a drop adds to the faithful adapter's lost cases."""
    scenarios = [Scenario.with_drop(base_validity, d, discordance, halluc_base, halluc_adapter) for d in drops]
    return [[verdict_rates(s, effective_n(n, design_effect), config) for s in scenarios] for n in ns]


def _check_n(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ToolfidError(f"the number of cases must be a positive integer (got {n!r})")
