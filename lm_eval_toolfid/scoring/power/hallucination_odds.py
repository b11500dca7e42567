"""The hallucination gate in the exact sums: P(it fails), P(it holds) given the two views' valid counts, for
binomial hallucinated counts in each view, compared exactly as ``judge`` compares them."""

from __future__ import annotations

import numpy as np

from lm_eval_toolfid.scoring.power.binomial import _central, _log_factorials, _pmf
from lm_eval_toolfid.scoring.power.scenario import Scenario
from lm_eval_toolfid.scoring.verdict import VerdictConfig


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
            if n_a == 0:  # no valid adapter call: the gate is not measured (exact._table_rates masks it)
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
