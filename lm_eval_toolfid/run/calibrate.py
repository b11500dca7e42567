"""In-process null calibration: load the base once, swap each null adapter's weights into the
loaded adapter in place, run the task, fit (``toolfid calibrate``, ``toolfid run --null-runs``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lm_eval_toolfid.calibration.fit import Calibration

log = logging.getLogger("lm_eval.toolfid")
from lm_eval_toolfid.calibration.nulls import DEFAULT_MULTIPLIERS, make_null_adapters
from lm_eval_toolfid.calibration.posthoc import calibration_from_results, write_calibration


def calibrate_in_process(base: str, adapter: str, runs: int, out: Path, task: str, metadata: dict[str, Any],
                         seed: int = 0, batch_size: int | str = "auto",
                         multipliers: tuple[float, ...] = DEFAULT_MULTIPLIERS,
                         null_dir: Path | None = None, session: Any = None,
                         run_base: bool = True) -> Calibration:
    """Load the base once (with the real adapter's LoRA modules), swap each null in, run, fit.

    With ``session`` (a loaded :class:`~lm_eval_toolfid.run.session.ModelSession` whose ``default``
    adapter is ``adapter``), no model is loaded and the real weights are restored afterwards;
    ``run_base=False`` when that session already ran the base view (the reference exists).
    """
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    from lm_eval_toolfid.run.session import ModelSession
    from lm_eval_toolfid.run.views import evaluate_base

    null_dir = null_dir or out.parent / "null_adapters"
    paths = make_null_adapters(adapter, runs, null_dir, seed=seed, multipliers=multipliers, base=base)
    session = session or ModelSession(base, adapter, batch_size=batch_size)
    session.activate("default")
    real = {k: v.detach().clone() for k, v in get_peft_model_state_dict(session.peft_model, adapter_name="default").items()}
    if run_base:  # the base reference every null run pairs with
        evaluate_base(session, task, metadata)
    results = []
    try:
        for path in paths:
            state = load_file(str(path / "adapter_model.safetensors"))
            set_peft_model_state_dict(session.peft_model, state, adapter_name="default")
            results.append(session.evaluate(task, metadata, adapter=str(path), label=path.name).results)
    finally:
        set_peft_model_state_dict(session.peft_model, real, adapter_name="default")
    calibration = calibration_from_results(results, task)
    write_calibration(calibration, out)
    return calibration

