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


def paired_difference_ci(deltas: Sequence[int | None], base_valid: Sequence[int | None],
                         z: float = 1.959964) -> tuple[float, float] | None:
    """95% interval for a paired difference of proportions, p(adapter) − p(base).

    Newcombe's hybrid score interval for paired data (Newcombe 1998, method 10): Wilson intervals
    of the two marginal rates combined with the observed correlation. Closed form and
    deterministic; unlike a bootstrap it stays wide when no case changed (ten identical cases do not
    prove a difference of exactly zero). ``deltas`` are per-case adapter − base in {−1, 0, 1},
    ``base_valid`` the base's per-case 0/1, aligned; None entries are skipped.
    """
    cells = [(d, b) for d, b in zip(deltas, base_valid) if d is not None and b is not None]
    n = len(cells)
    if n == 0:
        return None
    both = sum(1 for d, b in cells if b == 1 and d == 0)  # valid in both views
    gained = sum(1 for d, _ in cells if d > 0)  # adapter valid, base not
    lost = sum(1 for d, _ in cells if d < 0)  # base valid, adapter not
    neither = n - both - gained - lost
    p1, p2 = (both + gained) / n, (both + lost) / n
    l1, u1 = wilson_interval(both + gained, n, z)
    l2, u2 = wilson_interval(both + lost, n, z)
    denom = (both + gained) * (lost + neither) * (both + lost) * (gained + neither)
    phi = 0.0 if denom == 0 else (both * neither - gained * lost) / math.sqrt(denom)
    theta = p1 - p2
    low = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return (max(-1.0, theta - low), min(1.0, theta + high))


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
