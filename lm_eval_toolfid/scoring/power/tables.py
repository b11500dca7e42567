"""The multinomial 2×2 tables of n cases, factored: blocks of one discordant count K each (n10 | K and
n11 | K independent binomials), each leaving out tails of at most a third of the tolerance per level,
and a block's tables as flat arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lm_eval_toolfid.scoring.power.binomial import _central, _log_factorials, _pmf, _split
from lm_eval_toolfid.scoring.power.scenario import Scenario


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
