"""The power chart of ``toolfid power --svg``: P(FAIL) against the validity drop, one line per n."""

from __future__ import annotations

from typing import Sequence

from lm_eval_toolfid.reporting.svg import line_chart


def power_chart(ns: Sequence[int], drops: Sequence[float], fail: Sequence[Sequence[float]],
                marked: Sequence[float], subtitle: str, floor: float, power: float = 0.8,
                alpha: float = 0.05) -> str:
    """``fail[i][j]``: P(FAIL) at ``ns[i]`` cases and drop ``drops[j]``; drops in ``marked`` get a dot.

    Reference lines: the target power, the false-alarm limit, and the drop the floor stands for.
    """
    series = [(f"n={n}", list(drops), list(row)) for n, row in zip(ns, fail)]
    marks = [[(d, f) for d, f in zip(drops, row) if any(abs(d - m) < 1e-12 for m in marked)] for row in fail]
    x_max = max(drops) if drops and max(drops) > 0 else 0.1
    return line_chart(
        "P(FAIL) by validity drop", series, x_label="drop in validity (lost − gained)", y_label="P(FAIL)",
        x_range=(min(0.0, min(drops, default=0.0)), x_max), hlines=[(power, f"power {power:g}"), (alpha, f"{alpha:g}")],
        vlines=[(-floor, f"floor {floor:+g}")] if -floor <= x_max else [], marks=marks, note=subtitle)
