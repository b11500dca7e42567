"""``toolfid calibrate`` in process: the null adapters written, the base loaded once with the real adapter, the
base view run (its reference is what every null pairs with), each null's weights swapped into the loaded adapter
in place and run, the fit written. ``toolfid run --null-runs`` runs the same nulls between its base view and its
adapter views (:meth:`lm_eval_toolfid.run.session.ModelSession.calibrate`)."""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.calibration.fit import Calibration
from lm_eval_toolfid.calibration.nulls import CalibrationSpec, make_nulls
from lm_eval_toolfid.run.plan import ModelOptions, View
from lm_eval_toolfid.run.session import ModelSession, check_adapters


def calibrate_in_process(base: str, adapter: str, spec: CalibrationSpec, task: str, metadata: dict[str, Any],
                         batch_size: int | str = "auto") -> Calibration:
    """The nulls of ``spec`` for ``adapter`` on ``base``, run and fitted into ``spec.out``."""
    nulls = make_nulls(spec, adapter, base)
    check_adapters([adapter], base)
    session = ModelSession(base, ModelOptions(batch_size=batch_size)).load({"adapter": adapter})
    with session.base_view():
        session.evaluate_current(View("base", None, metadata), task)
    return session.fit_nulls(spec, nulls, task, metadata)
