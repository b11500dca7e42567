"""Binomial pieces of the exact sums: log-factorials (grown on demand), normalised probability vectors and
windows of them, the central range that leaves out at most a given tail."""

from __future__ import annotations

import math

import numpy as np

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
