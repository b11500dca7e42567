"""The verdict's 95% paired interval (Tango's score interval, adapter − base), vectorised over tables with the
same floating-point operations as :func:`lm_eval_toolfid.core.stats.tango_limits`, and the real
:func:`~lm_eval_toolfid.core.stats.paired_difference_ci` for a bound within :data:`_BORDER` of the floor."""

from __future__ import annotations

import functools
import inspect

import numpy as np

from lm_eval_toolfid.core.stats import TANGO_ITERATIONS, paired_difference_ci

Z95: float = inspect.signature(paired_difference_ci).parameters["z"].default
"""The z of the verdict's 95% interval: :func:`paired_difference_ci`'s own default."""
_BORDER = 1e-9
"""An interval bound this close to the floor is recomputed by the real function."""


def _tango_low(n10: np.ndarray, n01: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Lower limit of :func:`paired_difference_ci` (Tango's score interval, adapter − base), vectorised
    over tables: the same bisection with the same floating-point operations as
    :func:`lm_eval_toolfid.core.stats.tango_limits`."""
    return _tango_limit(n10, n01, n, upper=False)


def _tango_high(n10: np.ndarray, n01: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Upper limit of the same interval, vectorised the same way."""
    return _tango_limit(n10, n01, n, upper=True)


def _tango_limit(n10: np.ndarray, n01: np.ndarray, n: np.ndarray, upper: bool) -> np.ndarray:
    """The bisection once per distinct (n10, n01, n) instead of once per table: the interval reads only the
    discordant counts and the size, and a power sweep's tables repeat them (every split of the concordant cases
    between n11 and n00 shares one). Tables of one size up to :data:`_KEEP_MAX` also keep the limits computed
    for that size (:func:`_limits_kept`), so the sweep's next block at that size bisects only what is new. Each
    limit comes from the same element-wise operations on the same numbers: the same bits as bisecting every
    table."""
    lost, gained, size = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (n10, n01, n)))
    if lost.size < 64:
        return _tango_bisect(lost, gained, size, upper)
    n0 = int(size.flat[0])
    if 0 < n0 <= _KEEP_MAX and np.all(size == n0):
        cell = lost.ravel() * (n0 + 1) + gained.ravel()
        unique, where = np.unique(cell, return_inverse=True)
        values, known = _limits_kept(n0, upper)
        new = unique[~known[unique]]
        if new.size:
            values[new] = _tango_bisect(new // (n0 + 1), new % (n0 + 1), np.full(new.shape, n0), upper)
            known[new] = True
        return values[unique][where].reshape(lost.shape)
    base = int(size.max()) + 1
    key = (lost.ravel() * base + gained.ravel()) * base + size.ravel()
    unique, where = np.unique(key, return_inverse=True)
    limits = _tango_bisect(unique // (base * base), (unique // base) % base, unique % base, upper)
    return limits[where].reshape(lost.shape)


_KEEP_MAX = 2000
"""The largest size whose limits are kept between calls (two arrays of (n+1)² cells: 36 MB at 2000)."""


@functools.lru_cache(maxsize=4)
def _limits_kept(n: int, upper: bool) -> tuple[np.ndarray, np.ndarray]:
    """The limits computed so far at size ``n``, by cell ``n10 * (n + 1) + n01``, and which cells are known."""
    return np.zeros((n + 1) ** 2), np.zeros((n + 1) ** 2, dtype=bool)


def _tango_bisect(n10: np.ndarray, n01: np.ndarray, n: np.ndarray, upper: bool) -> np.ndarray:
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
