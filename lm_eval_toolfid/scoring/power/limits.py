"""Where the verdict's rates go as n grows (0, 1, or about ½ on a threshold), and from that why no n can
meet a plan's targets (the reasons :func:`solve_n` and :func:`solve_n_strata` give)."""

from __future__ import annotations

from lm_eval_toolfid.scoring.power.scenario import MultiTurn, Scenario, _mixture
from lm_eval_toolfid.scoring.verdict import VerdictConfig


def limit_fail_rate(scenario: Scenario, config: VerdictConfig) -> float:
    """Where P(FAIL) goes as n grows: 0, 1, or about ½ when a rate sits exactly on its threshold."""

    def side(value: float, threshold: float, variable: bool) -> float:
        if abs(value - threshold) <= 1e-12:
            return 0.5 if variable else 0.0
        return 1.0 if value > threshold else 0.0

    p = scenario.base_validity
    base = _limit_base_ok(p, config)
    validity = side(scenario.drop, -config.validity_delta_floor, scenario.discordance > 0)
    halluc = 0.0
    if p - scenario.drop > 0 and scenario.hallucinates:
        value = scenario.halluc_adapter - (0 if config.hallucination_gate == "absolute" else scenario.halluc_base)
        halluc = side(value, config.hallucination_cap, 0 < scenario.halluc_adapter < 1)
    return base * (1 - (1 - validity) * (1 - halluc))


def _limit_base_ok(p: float, config: VerdictConfig) -> float:
    """Where P(base validity ≥ min_base_validity) goes as n grows."""
    mb = config.min_base_validity
    if p > mb + 1e-12 or mb == 0:
        return 1.0
    if abs(p - mb) <= 1e-12:
        return 1.0 if p in (0.0, 1.0) else 0.5  # exactly on the threshold: certain only without variance
    return 0.0


def _strata_infeasible(scenario: Scenario, multi_turn: MultiTurn, config: VerdictConfig, power: float,
                       alpha: float) -> str:
    """Why no n can meet the targets, from the rates' limits as n grows (empty when some n may)."""
    whole, conv = _mixture(scenario, multi_turn), multi_turn.scenario
    has_conv = multi_turn.share > 0

    def limit(whole_sc: Scenario, conv_sc: Scenario) -> float:
        """P(FAIL) as n grows: the base gate of the whole set, then its validity gate or the conversations'
        (whose own base gate only switches theirs off)."""
        base = _limit_base_ok(whole_sc.base_validity, config)
        if base == 0:
            return 0.0
        gates = limit_fail_rate(whole_sc, config) / base
        conv_fail = limit_fail_rate(conv_sc, config) if has_conv else 0.0
        return base * (1 - (1 - gates) * (1 - conv_fail))

    if whole.base_validity < config.min_base_validity:
        return (f"the base's validity {whole.base_validity:.2f} is below min_base_validity "
                f"{config.min_base_validity:.2f}: every verdict is UNDECIDED")
    if limit(whole, conv) < power:
        return (f"FAIL needs the observed drop of the whole set or of the conversations to exceed "
                f"{-config.validity_delta_floor:.3f}; drops of {whole.drop:.3f} (whole set) and {conv.drop:.3f} "
                f"(conversations) do not reach {power:.0%} at any n")
    if limit(_mixture(scenario.faithful(), MultiTurn(multi_turn.share, conv.faithful())), conv.faithful()) > alpha:
        return (f"at floor {config.validity_delta_floor:+.3f} a faithful adapter fails about half the time at any n; "
                "use a floor below 0")
    return ""


def _infeasible(scenario: Scenario, faithful: Scenario, config: VerdictConfig, power: float, alpha: float) -> str:
    floor = config.validity_delta_floor
    if scenario.base_validity < config.min_base_validity:
        return (f"the base's validity {scenario.base_validity:.2f} is below min_base_validity "
                f"{config.min_base_validity:.2f}: every verdict is UNDECIDED")
    if limit_fail_rate(scenario, config) < power:
        suggestion = -round(scenario.drop / 2, 3) or -0.001
        return (f"FAIL needs the observed drop to exceed {-floor:.3f} (in either gate mode), so P(FAIL) for a drop of "
                f"{scenario.drop:.3f} does not reach {power:.0%} at any n; a floor above {-scenario.drop:.3f} "
                f"would (e.g. --floor {suggestion:g})")
    if limit_fail_rate(faithful, config) > alpha:
        return (f"at floor {floor:+.3f} a faithful adapter with discordance {faithful.discordance:.3f} fails about "
                "half the time at any n; use a floor below 0")
    return ""
