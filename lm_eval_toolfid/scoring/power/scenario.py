"""The model of one adapter: its per-case rates (:class:`Scenario`), the conversations of a case set as a
stratum of their own (:class:`MultiTurn`), the whole set's rates when the two mix, and :func:`effective_n`
(independent cases when correlated ones inflate the variance). The model itself: see the package docstring
and docs/power.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError

DEFAULT_DISCORDANCE = 0.04
"""Planning default: a faithful adapter changes 4% of cases (2% lost, 2% gained). Measure your own:
(lost + gained) / n of ``validity_discordant`` in a faithful adapter's results."""


@dataclass(frozen=True)
class Scenario:
    """One adapter under the paired binomial model (rates per case; see the package docstring)."""

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


def _mixture(scenario: Scenario, multi_turn: MultiTurn) -> Scenario:
    """The whole case set's rates: the two strata weighted by their shares."""
    s, conv = multi_turn.share, multi_turn.scenario

    def mix(a: float, b: float) -> float:
        return (1 - s) * a + s * b

    return Scenario(mix(scenario.base_validity, conv.base_validity), mix(scenario.lost, conv.lost),
                    mix(scenario.gained, conv.gained))


def effective_n(n: int, design_effect: float = 1.0) -> int:
    """Cases that count as independent when correlated cases inflate the variance by ``design_effect``."""
    if not math.isfinite(design_effect) or design_effect < 1.0:
        raise ToolfidError(f"the design effect must be ≥ 1 (got {design_effect!r})")
    return max(1, round(n / design_effect))
