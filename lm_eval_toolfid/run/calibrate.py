"""Null calibration in process: load the base once, swap each null adapter's weights into the
loaded adapter in place, run the task, fit (``toolfid calibrate``; ``toolfid run --null-runs`` runs the
same :class:`CalibrationStage` between its base view and its adapter views)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from lm_eval_toolfid.calibration.fit import Calibration
from lm_eval_toolfid.calibration.nulls import DEFAULT_MULTIPLIERS, make_null_adapters
from lm_eval_toolfid.calibration.posthoc import calibration_from_results, write_calibration
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.run.plan import ModelOptions, RunPlan, View
from lm_eval_toolfid.run.session import ModelSession, check_adapters

log = logging.getLogger("lm_eval.toolfid")


@dataclass(frozen=True)
class CalibrationStage:
    """K null adapters per multiplier, shaped like the real adapter, run on a loaded session whose ``default``
    adapter is the real one (its weights restored afterwards), then fitted into ``out``."""

    runs: int
    out: Path
    """The calibration JSON."""
    seed: int = 0
    multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS
    null_dir: Path | None = None
    """Where the null adapters go (default: ``null_adapters`` beside ``out``)."""

    def progress_labels(self) -> list[str]:
        """The null views this stage adds to a run's progress, in order (named as the null adapters)."""
        return [f"null_{i:02d}" for i in range(self.runs * len(self.multipliers))]

    def check(self, adapters: Mapping[str, str]) -> None:
        """One calibration serves every adapter of a run only if they share one shape and one update norm."""
        from lm_eval_toolfid.calibration.adapters import adapter_shape, adapter_update_norm, norms_agree

        shapes = {adapter_shape(p)["hash"] for p in adapters.values()}
        if len(shapes) > 1:
            raise ToolfidError("--null-runs calibrates one adapter shape; these adapters differ in shape: "
                               "calibrate them in separate runs")
        norms = {name: adapter_update_norm(p) for name, p in adapters.items()}
        first_norm = next(iter(norms.values()))
        if not all(norms_agree(first_norm, v) for v in norms.values()):
            raise ToolfidError("--null-runs calibrates one adapter update norm; these adapters differ ("
                               + ", ".join(f"{k} {v:.3g}" for k, v in norms.items()) + "): run each with --null-runs")

    def make_nulls(self, adapter: str, base: str) -> list[Path]:
        return make_null_adapters(adapter, self.runs, self.null_dir or self.out.parent / "null_adapters",
                                  seed=self.seed, multipliers=self.multipliers, base=base)

    def run_in(self, session: Any, plan: RunPlan) -> dict[str, Any]:
        """A stage of ``toolfid run --null-runs``, after the base view (the nulls pair with its reference): nulls
        of the plan's first adapter (the session's ``default``) run and fitted; returns the settings of the
        adapter views that follow (judged against this calibration)."""
        if not isinstance(session, ModelSession):
            raise ToolfidError("null calibration runs in process (the session must load the base)")
        self.run(session, next(iter(plan.adapters.values())), plan.task, plan.metadata)
        return {**plan.metadata, "calibration": str(self.out)}

    def run(self, session: ModelSession, adapter: str, task: str, metadata: Mapping[str, Any]) -> Calibration:
        """Nulls of ``adapter`` (the session's ``default`` adapter), each run after the base view, fitted."""
        return self.fit(session, self.make_nulls(adapter, session.base), task, metadata)

    def fit(self, session: ModelSession, nulls: list[Path], task: str, metadata: Mapping[str, Any]) -> Calibration:
        """Each null's weights swapped into the session's ``default`` adapter in turn, the task run, the fit
        written; the base reference they pair with must exist (the session's base view ran)."""
        from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
        from safetensors.torch import load_file

        session.activate("default")
        real = {k: v.detach().clone()
                for k, v in get_peft_model_state_dict(session.peft_model, adapter_name="default").items()}
        results = []
        try:
            for path in nulls:
                state = load_file(str(path / "adapter_model.safetensors"))
                set_peft_model_state_dict(session.peft_model, state, adapter_name="default")
                view = session.evaluate_current(View(path.name, str(path), dict(metadata)), task)
                if session.progress is not None:
                    session.progress.view_finished(view.label, len(view.samples))
                results.append(view.results)
        finally:
            set_peft_model_state_dict(session.peft_model, real, adapter_name="default")
        calibration = calibration_from_results(results, task)
        write_calibration(calibration, self.out)
        return calibration


def calibrate_in_process(base: str, adapter: str, stage: CalibrationStage, task: str, metadata: dict[str, Any],
                         batch_size: int | str = "auto") -> Calibration:
    """``toolfid calibrate``: the nulls written, the base loaded once (with the real adapter's LoRA modules),
    the base view run (its reference is what every null pairs with), the nulls run, the fit written."""
    nulls = stage.make_nulls(adapter, base)
    check_adapters([adapter], base)
    session = ModelSession(base, ModelOptions(batch_size=batch_size)).load({"adapter": adapter})
    with session.base_view():
        session.evaluate_current(View("base", None, metadata), task)
    return stage.fit(session, nulls, task, metadata)
