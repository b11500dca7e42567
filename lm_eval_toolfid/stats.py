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
