"""Statistics helpers and the compound verdict."""


import pytest

from lm_eval_toolfid.core.records import Summary
from lm_eval_toolfid.core.stats import jeffreys_rate, mcnemar_exact_p, mean_stderr, wilson_interval
from lm_eval_toolfid.scoring.verdict import NullComparison, VerdictConfig, judge


def test_mcnemar_exact():
    assert mcnemar_exact_p([0, 0, 0]) == 1.0
    # 10 lost, 0 gained: p = 2 * 0.5**10
    assert mcnemar_exact_p([-1] * 10 + [0] * 50) == pytest.approx(2 * 0.5**10)
    assert mcnemar_exact_p([-1, 1] * 5) == 1.0
    assert 0 < mcnemar_exact_p([-1] * 600 + [1] * 500) < 0.01  # big n: no float underflow


def test_paired_stderr_and_intervals():
    assert mean_stderr([1, -1]) == pytest.approx(1.0)  # sample std √2 over √2
    assert mean_stderr([0, 0, 0]) == 0.0
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and 0 < hi < 0.2
    assert jeffreys_rate(0, 99) == pytest.approx(0.005)


def summary(delta=0.0, halluc=0.0, valid=0.9, n=100, ci=None, identical=None):
    metrics = {"json_valid_rate": valid, "base_json_valid_rate": valid - delta, "validity_delta": delta,
               "hallucination_rate": halluc, "hallucination_delta": halluc, "identical_output_rate": identical}
    return Summary(n=n, n_relevant=n, metrics=metrics, denominators={"hallucination_rate": 90}, outcome_counts={},
                   paired=True, validity_delta_ci=ci or (delta - 0.04, delta + 0.04))


def test_compound_rule():
    assert judge(summary()).passed is True
    assert judge(summary(delta=-0.05)).passed is True  # floor is inclusive
    v = judge(summary(delta=-0.2))
    assert v.passed is False and v.failed_gates() == ["validity_delta"]
    assert "statistically clear" in v.reason
    v = judge(summary(halluc=0.5))
    assert v.passed is False and v.failed_gates() == ["hallucination_delta"]
    assert judge(summary(delta=-0.2), VerdictConfig(validity_delta_floor=-0.3)).passed is True


def test_unpaired_is_undecided():
    s = Summary(n=10, n_relevant=10, metrics={"json_valid_rate": 1.0}, outcome_counts={})
    v = judge(s)
    assert v.passed is None and v.label == "UNDECIDED" and "no paired base" in v.reason


def test_z_gate_only_when_the_null_is_informative():
    informative = NullComparison(z=1.0, null_mean=0.1, null_std=0.05, informative=True, null_validity_delta=-0.8)
    v = judge(summary(), null=informative)
    assert v.passed is False and v.failed_gates() == ["json_valid_z"]
    useless = NullComparison(z=1.0, null_mean=0.88, null_std=0.05, informative=False, null_validity_delta=-0.01)
    v = judge(summary(), null=useless)
    assert v.passed is True and any("not informative" in n for n in v.notes)


def test_paired_interval_never_collapses_when_no_case_changed():
    """Tango's score interval: with no discordant case, |limit| solves n x / (1 − x) = z², whatever the base's
    validity (Newcombe's method 10 gave [0, 0] at a base valid on half the cases, and a noninferiority PASS)."""
    from lm_eval_toolfid.core.stats import paired_difference_ci, tango_limits

    z = 1.959964
    for n in (10, 48, 268):
        expected = z * z / (n + z * z)
        for valid in (0, n // 2, n):
            low, high = paired_difference_ci([0] * n, [1] * valid + [0] * (n - valid))
            assert low == pytest.approx(-expected, abs=1e-12) and high == pytest.approx(expected, abs=1e-12)
    # the limits bracket the estimate and move with the discordant counts only
    low, high = tango_limits(gained=4, lost=10, n=268)
    assert low < -6 / 268 < high and tango_limits(4, 10, 268) == paired_difference_ci(
        [1] * 4 + [-1] * 10 + [0] * 254, [0] * 4 + [1] * 10 + [1] * 254)
    assert tango_limits(0, 20, 20)[0] == -1.0 and tango_limits(20, 0, 20)[1] == 1.0


def test_ten_unchanged_cases_do_not_earn_a_noninferiority_pass():
    from lm_eval_toolfid.scoring.power import judge_table
    from lm_eval_toolfid.scoring.verdict import VerdictConfig

    verdict = judge_table(5, 0, 0, 5, VerdictConfig(gate_mode="noninferiority"))
    assert verdict.passed is None and "validity_delta" in verdict.reason


# --- a gate whose metric is undefined is not measured -------------------------------------------

def _broken_adapter(base_valid=0.75, base_halluc=0.75, n=100):
    """An adapter with no valid call at all: its hallucination_rate is undefined, so hallucination_delta is too."""
    metrics = {"json_valid_rate": 0.0, "base_json_valid_rate": base_valid, "validity_delta": -base_valid,
               "hallucination_rate": None, "base_hallucination_rate": base_halluc, "hallucination_delta": None}
    return Summary(n=n, n_relevant=n, metrics=metrics, denominators={"hallucination_rate": 0}, outcome_counts={},
                   paired=True, validity_delta_ci=(-base_valid - 0.08, -base_valid + 0.08))


@pytest.mark.parametrize("mode", ["delta", "absolute"])
def test_hallucination_not_measured_when_the_adapter_makes_no_valid_call(mode):
    v = judge(_broken_adapter(), VerdictConfig(hallucination_gate=mode))
    gate = {g.name: g for g in v.gates}["hallucination_delta" if mode == "delta" else "hallucination_rate"]
    assert gate.measured is False and gate.passed is None and gate.value is None
    # the validity gate FAILs such an adapter; the reason names it first, then the gate that was not measured
    assert v.passed is False and v.failed_gates() == ["validity_delta"]
    assert v.reason.startswith("validity_delta -0.750 < -0.050 (statistically clear")
    assert v.reason.endswith("; hallucination not measured: the adapter makes no valid call")
    assert v.as_record()["gates"][1]["measured"] is False
    # with the validity gate out of the way (floor −1) it is still never a PASS: UNDECIDED, saying why
    loose = judge(_broken_adapter(), VerdictConfig(hallucination_gate=mode, validity_delta_floor=-1.0))
    assert loose.passed is None and loose.reason == "hallucination not measured: the adapter makes no valid call"


def test_hallucination_not_measured_when_the_base_makes_no_valid_call():
    s = summary(valid=0.5, delta=0.5)  # base 0% valid
    s = s.model_copy(update={"metrics": {**s.metrics, "base_hallucination_rate": None, "hallucination_delta": None}})
    v = judge(s)
    assert v.passed is None and "the base makes valid calls on only 0%" in v.reason  # min_base_validity first
    loose = judge(s, VerdictConfig(min_base_validity=0.0))
    assert loose.passed is None and loose.reason == "hallucination not measured: the base makes no valid call"
    # the absolute rule needs the adapter's rate alone: measured, and it holds
    assert judge(s, VerdictConfig(min_base_validity=0.0, hallucination_gate="absolute")).passed is True
    neither = s.model_copy(update={"metrics": {**s.metrics, "hallucination_rate": None}})
    assert judge(neither, VerdictConfig(min_base_validity=0.0)).reason == \
        "hallucination not measured: neither view makes a valid call"


def test_false_calls_not_measured_when_one_view_has_no_irrelevance_case():
    s = summary()
    with_fc = s.model_copy(update={"n_irrelevant": 20, "metrics": {
        **s.metrics, "false_call_rate": 0.3, "base_false_call_rate": None, "false_call_delta": None}})
    v = judge(with_fc)
    gate = {g.name: g for g in v.gates}["false_call_delta"]
    assert gate.measured is False and gate.passed is None and v.passed is None
    assert v.reason == "false calls not measured: the base has no case that expects no call in its denominator"
    measured = with_fc.model_copy(update={"metrics": {**with_fc.metrics, "base_false_call_rate": 0.1,
                                                      "false_call_delta": 0.2}})
    assert judge(measured).failed_gates() == ["false_call_delta"]
