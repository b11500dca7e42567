"""Small, dependency-free statistics: means over defined values, paired tests, intervals."""

from __future__ import annotations

import math
from typing import Sequence


def mean_defined(items: Sequence[float | int | None]) -> float | None:
    """Mean of the non-None items; None when there are none."""
    values = [float(x) for x in items if x is not None]
    return sum(values) / len(values) if values else None


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (n−1); 0.0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mu = sum(values) / len(values)
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (len(values) - 1))


def mean_stderr(items: Sequence[float | int | None]) -> float | None:
    """Standard error of the mean of the defined items (for paired deltas: the paired SE)."""
    values = [float(x) for x in items if x is not None]
    if len(values) < 2:
        return None
    return sample_std(values) / math.sqrt(len(values))


def _binom_half_cdf(k: int, n: int) -> float:
    """P(X ≤ k) for X ~ Binomial(n, ½), exact in integer arithmetic."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def mcnemar_exact_p(deltas: Sequence[int | None]) -> float:
    """Two-sided exact McNemar p-value for a paired change in validity.

    ``deltas`` are per-case ft − base validity in {−1, 0, +1}; only discordant cases count.
    """
    lost = sum(1 for d in deltas if d is not None and d < 0)
    gained = sum(1 for d in deltas if d is not None and d > 0)
    n = lost + gained
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * _binom_half_cdf(min(lost, gained), n))


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def jeffreys_rate(successes: float, n: float) -> float:
    """Posterior mean of a binomial rate under the Jeffreys prior Beta(½, ½)."""
    return (successes + 0.5) / (n + 1.0)


def binomial_se(rate: float, n: float) -> float:
    """Standard error of a proportion estimated from ``n`` trials at ``rate``."""
    return math.sqrt(rate * (1 - rate) / n) if n > 0 else 0.5


TANGO_ITERATIONS = 64
"""Bisection steps for a Tango limit on [−1, 1]: 2 / 2**64 is far below a double's resolution there."""


def tango_statistic(delta: float, gained: int, lost: int, n: int) -> float:
    """Tango's score statistic for H0: p(adapter) − p(base) = ``delta`` with paired 0/1 outcomes.

    T(δ) = (g − l − nδ) / sqrt(n (2 p̃ + δ(1 − δ))), where g, l are the discordant counts (cases gained,
    lost) and p̃ is the maximum-likelihood estimate of P(lost) under H0 (the positive root of
    2n p² + (−g − l + (2n − g + l)δ) p − l δ(1 − δ) = 0). T decreases in δ.
    """
    b = -gained - lost + (2 * n - gained + lost) * delta
    c = -lost * delta * (1 - delta)
    p_lost = (math.sqrt(max(0.0, b * b - 8 * n * c)) - b) / (4 * n)
    num = gained - lost - n * delta
    var = n * (2 * p_lost + delta * (1 - delta))
    if num == 0:
        return 0.0
    return num / math.sqrt(var) if var > 0 else math.copysign(math.inf, num)


def paired_difference_ci(deltas: Sequence[int | None], base_valid: Sequence[int | None],
                         z: float = 1.959964) -> tuple[float, float] | None:
    """95% interval for a paired difference of proportions, p(adapter) − p(base).

    Tango's asymptotic score interval (Tango 1998; recommended for paired proportions by Fagerland,
    Lydersen & Laake 2014): the δ where the score statistic :func:`tango_statistic` crosses ±z, found by
    bisection (deterministic). It depends only on the cases lost, the cases gained and n, and it stays
    honest when no case changed: ten identical cases give about ±0.28, whatever the base's validity.
    (Newcombe's method 10, used before, collapsed to [0, 0] when no case changed and the base was valid
    on half of them.) ``deltas`` are per-case adapter − base in {−1, 0, 1}, ``base_valid`` the base's
    per-case 0/1, aligned; None entries are skipped.
    """
    cells = [d for d, b in zip(deltas, base_valid) if d is not None and b is not None]
    n = len(cells)
    if n == 0:
        return None
    gained = sum(1 for d in cells if d > 0)
    lost = sum(1 for d in cells if d < 0)
    return tango_limits(gained, lost, n, z)


def tango_limits(gained: int, lost: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """(lower, upper) limits of Tango's interval from the discordant counts."""
    estimate = (gained - lost) / n

    def root(target: float) -> float:  # the δ in (−1, 1) where T(δ) = target (T decreases)
        lo, hi = -1.0, 1.0
        for _ in range(TANGO_ITERATIONS):
            mid = (lo + hi) / 2
            if tango_statistic(mid, gained, lost, n) > target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = -1.0 if estimate == -1 else root(z)
    high = 1.0 if estimate == 1 else root(-z)
    return (max(-1.0, min(low, estimate)), min(1.0, max(high, estimate)))


def difference_ci(k1: int, n1: int, k2: int, n2: int, z: float = 1.959964) -> tuple[float, float] | None:
    """95% interval for p1 − p2 of two independent proportions (Newcombe's method 10, unpaired)."""
    if n1 == 0 or n2 == 0:
        return None
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, z)
    l2, u2 = wilson_interval(k2, n2, z)
    theta = p1 - p2
    return (max(-1.0, theta - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)),
            min(1.0, theta + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)))
