"""The verdict on outcome tables (n11 valid in both views, n10 lost, n01 gained, n00 invalid in both), two ways.

- :func:`judge_table` is the plain path: it builds the table's :class:`PairScore` records
  (:func:`pairs_for_table`), runs :func:`~lm_eval_toolfid.scoring.metrics.summarize` and
  :func:`~lm_eval_toolfid.scoring.verdict.judge`;
- :func:`decide` applies the same rule to whole arrays of tables at once (numpy), gate by gate
  (:func:`validity_states`, :func:`multiturn_fails`, :func:`hallucination_unmeasured`), computing every
  compared number with the same floating-point operations as ``summarize``.

The two cannot share one definition of the gates: ``judge`` reads a :class:`Summary` and builds a
:class:`Gate` per rule (with its notes and reasons), ``decide`` compares arrays of millions of tables.
They share the thresholds (:class:`VerdictConfig`, :data:`MIN_GATE_N`) and the interval's z and
iteration count; ``tests/test_power.py`` proves the two paths equal on every table with n ≤ 20 and
n = 30, with hallucinated calls (n ≤ 8) and with conversations (drawn case sets).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lm_eval_toolfid.core.records import Outcome, OutcomeKind, PairScore
from lm_eval_toolfid.scoring.metrics import summarize
from lm_eval_toolfid.scoring.power.interval import _BORDER, _real_low, _tango_high, _tango_low
from lm_eval_toolfid.scoring.verdict import MIN_GATE_N, Verdict, VerdictConfig, judge

PASS, FAIL, UNDECIDED = 0, 1, 2
"""Label codes of :func:`decide`'s arrays."""
LABELS = ("PASS", "FAIL", "UNDECIDED")


_VALID = Outcome(kind=OutcomeKind.VALID, hallucinated=False)
_VALID_HALLUCINATED = Outcome(kind=OutcomeKind.VALID, hallucinated=True)
_INVALID = Outcome(kind=OutcomeKind.NO_CALL)


def pairs_for_table(n11: int, n10: int, n01: int, n00: int, k_adapter: int = 0, k_base: int = 0,
                    turn_depth: int = 1, prefix: str = "") -> list[PairScore]:
    """Case records of a table: n11 valid in both views, n10 lost, n01 gained, n00 invalid in both;
    ``k_adapter`` of the adapter's valid calls and ``k_base`` of the base's name an undeclared tool;
    every case at ``turn_depth`` (2: conversations), ids ``prefix`` + index."""
    if min(n11, n10, n01, n00, k_adapter, k_base) < 0:
        raise ValueError("table counts must be ≥ 0")
    if k_adapter > n11 + n01 or k_base > n11 + n10:
        raise ValueError("more hallucinated calls than valid ones")
    cells = [(True, True)] * n11 + [(True, False)] * n10 + [(False, True)] * n01 + [(False, False)] * n00
    pairs, seen_ft, seen_base = [], 0, 0
    for i, (base_valid, ft_valid) in enumerate(cells):
        ft = base = _INVALID
        if ft_valid:
            ft = _VALID_HALLUCINATED if seen_ft < k_adapter else _VALID
            seen_ft += 1
        if base_valid:
            base = _VALID_HALLUCINATED if seen_base < k_base else _VALID
            seen_base += 1
        pairs.append(PairScore(case_id=f"{prefix}{i}", ft=ft, base=base, turn_depth=turn_depth))
    return pairs


def judge_table(n11: int, n10: int, n01: int, n00: int, config: VerdictConfig = VerdictConfig(),
                k_adapter: int = 0, k_base: int = 0) -> Verdict:
    """The plain path: the verdict ``toolfid`` gives a run whose cases make this table."""
    return judge(summarize(pairs_for_table(n11, n10, n01, n00, k_adapter, k_base)), config)


def multiturn_fails(m11: Any, m10: Any, m01: Any, m00: Any, config: VerdictConfig) -> np.ndarray:
    """Per table of conversations: the verdict's multi-turn gate fails — at least ``MIN_GATE_N`` of them, a
    base valid on ≥ ``min_base_validity`` of them, the drop below the floor and the whole 95% interval too
    (a subset gate fails only when the failure is statistically clear)."""
    m11, m10, m01, m00 = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (m11, m10, m01, m00)))
    m = m11 + m10 + m01 + m00
    floor = config.validity_delta_floor
    with np.errstate(divide="ignore", invalid="ignore"):
        applies = (m >= MIN_GATE_N) & ~((m11 + m10) / np.maximum(m, 1) < config.min_base_validity)
        delta = np.where(m > 0, (m01 - m10) / np.maximum(m, 1), 0.0)
    high = np.ones(m.shape)
    some = np.flatnonzero((applies & (delta < floor)).ravel())
    if some.size:
        flat = [x.ravel() for x in (m11, m10, m01, m00)]
        rows = [x[some] for x in flat]
        limits = _tango_high(rows[1], rows[2], rows[0] + rows[1] + rows[2] + rows[3])
        for j in np.flatnonzero(np.abs(limits - floor) <= _BORDER):
            limits[j] = _real_low(*(int(x[j]) for x in rows), upper=True)
        high = high.ravel()
        high[some] = limits
        high = high.reshape(m.shape)
    return applies & (delta < floor) & (high < floor)


def validity_states(n11: np.ndarray, n10: np.ndarray, n01: np.ndarray, n00: np.ndarray,
                    config: VerdictConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per table: (base validity ≥ min_base_validity, validity gate: 1 pass, 0 undecided, −1 fail)."""
    n11, n10, n01, n00 = (np.asarray(x, dtype=np.int64) for x in (n11, n10, n01, n00))
    n = n11 + n10 + n01 + n00
    if np.any(n < 1):
        raise ValueError("every table needs at least one case")
    base_ok = ~((n11 + n10) / n < config.min_base_validity)
    delta = (n01 - n10) / n
    floor = config.validity_delta_floor
    if config.gate_mode == "point":
        state = np.where(delta < floor, -1, 1).astype(np.int8)
        return base_ok, state
    low = _tango_low(n10, n01, n)
    near = np.flatnonzero(np.abs(low - floor) <= _BORDER)
    if near.size:
        flat = [np.broadcast_to(x, low.shape).ravel() for x in (n11, n10, n01, n00)]
        low = low.copy().ravel()
        for i in near:
            low[i] = _real_low(*(int(x[i]) for x in flat))
        low = low.reshape(np.shape(delta))
    state = np.where(low >= floor, 1, np.where(delta < floor, -1, 0)).astype(np.int8)
    return base_ok, state


def hallucination_unmeasured(n_a: Any, n_b: Any, config: VerdictConfig) -> np.ndarray:
    """Per table: the hallucination gate is *not measured* — its rate is undefined because the adapter made
    no valid call (n_a = 0) or, for the delta, the base made none (n_b = 0). ``judge`` then cannot decide
    that gate: the verdict is UNDECIDED unless another gate fails."""
    missing = np.asarray(n_a) == 0
    if config.hallucination_gate != "absolute":
        missing = missing | (np.asarray(n_b) == 0)
    return missing


def _hallucination_fails(n_a: np.ndarray, n_b: np.ndarray, k_a: np.ndarray, k_b: np.ndarray,
                         config: VerdictConfig) -> np.ndarray:
    """The hallucination gate fails (only where it is measured: see :func:`hallucination_unmeasured`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate_a = np.where(n_a > 0, k_a / np.maximum(n_a, 1), 0.0)
        rate_b = np.where(n_b > 0, k_b / np.maximum(n_b, 1), 0.0)
    value = rate_a if config.hallucination_gate == "absolute" else rate_a - rate_b
    return ~hallucination_unmeasured(n_a, n_b, config) & (value > config.hallucination_cap)


def decide(n11: Any, n10: Any, n01: Any, n00: Any, config: VerdictConfig = VerdictConfig(),
           k_adapter: Any = None, k_base: Any = None, multi: tuple[Any, Any, Any, Any] | None = None) -> np.ndarray:
    """The verdict of every table at once: an array of :data:`PASS`, :data:`FAIL`, :data:`UNDECIDED`.

    ``k_adapter`` / ``k_base``: hallucinated valid calls per table (None: none). ``multi``: the tables of
    the conversations among the cases (m11, m10, m01, m00 — already counted in n11…n00), for the
    multi-turn gate (None: a case set without conversations).
    """
    n11, n10, n01, n00 = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (n11, n10, n01, n00)))
    base_ok, state = validity_states(n11, n10, n01, n00, config)
    hfail = np.zeros(n11.shape, dtype=bool)
    if k_adapter is not None or k_base is not None:
        k_a = np.broadcast_to(np.asarray(0 if k_adapter is None else k_adapter, dtype=np.int64), n11.shape)
        k_b = np.broadcast_to(np.asarray(0 if k_base is None else k_base, dtype=np.int64), n11.shape)
        hfail = _hallucination_fails(n11 + n01, n11 + n10, k_a, k_b, config)
    if multi is not None:
        hfail = hfail | multiturn_fails(*(np.broadcast_to(np.asarray(x, dtype=np.int64), n11.shape) for x in multi),
                                        config)
    unmeasured = hallucination_unmeasured(n11 + n01, n11 + n10, config)
    label = np.where(state == -1, FAIL, np.where(hfail, FAIL, np.where((state == 0) | unmeasured, UNDECIDED, PASS)))
    return np.where(base_ok, label, UNDECIDED).astype(np.int8)
