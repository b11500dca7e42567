"""The smallest drop caught: at n cases, the smallest drop (on a 0.001 grid) whose P(FAIL) reaches the power."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.scoring.power.exact import fail_rate
from lm_eval_toolfid.scoring.power.rates import _check_n
from lm_eval_toolfid.scoring.power.sample_size import DEFAULT_POWER
from lm_eval_toolfid.scoring.power.scenario import DEFAULT_DISCORDANCE, Scenario
from lm_eval_toolfid.scoring.verdict import VerdictConfig


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
