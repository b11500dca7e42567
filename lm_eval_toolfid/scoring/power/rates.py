"""The answer of the rate computations: :class:`VerdictRates` — P(PASS), P(FAIL), P(UNDECIDED) for n cases,
exact or by Monte Carlo — and the check every computation makes of n."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from lm_eval_toolfid.core.errors import ToolfidError


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


def _check_n(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ToolfidError(f"the number of cases must be a positive integer (got {n!r})")
