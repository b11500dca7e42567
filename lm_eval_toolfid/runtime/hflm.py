"""lm-eval's HFLM, stopping each sequence of a batch as soon as its tool call is complete.

``ToolfidHFLM`` differs from ``HFLM`` in one place, ``_model_generate``: next to lm-eval's
stop-sequence criteria it adds :func:`lm_eval_toolfid.runtime.stopping.make_stopping_criteria`, which
answers per row (lm-eval's own criteria only stop a batch once *every* row has hit a stop
sequence). Greedy decoding makes a stopped row's text a prefix of what the row would have
generated, so ``stopping.truncate_call`` of either text is the same string.

It stops early only for requests whose doc says they expect at most one call (the task's
``expected_calls`` column; the scoring core answers those cases with the text up to the end of
the first call, :func:`lm_eval_toolfid.scoring.outcome.answer_text`), so outcomes are identical to a run
that generated to ``until``/``max_gen_toks``. Requests of other tasks, or of cases that expect
several calls, generate as ``HFLM`` does.

``toolfid run`` (and calibration) build the model as this class::

    from lm_eval_toolfid.runtime.hflm import ToolfidHFLM   # instead of lm_eval.models.huggingface.HFLM
"""

from __future__ import annotations

from typing import Any

from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils_hf import stop_sequences_criteria

from lm_eval_toolfid.runtime.stopping import make_stopping_criteria


def single_call(request: Any) -> bool:
    """Whether a request is a tool_use_fidelity case answered by (at most) one call."""
    doc = getattr(request, "doc", None)
    if not isinstance(doc, dict) or "expected_calls" not in doc:
        return False
    try:
        return int(doc["expected_calls"]) <= 1
    except (TypeError, ValueError):
        return False


class ToolfidHFLM(HFLM):
    """HFLM whose generation stops per sequence at the end of the first complete tool call."""

    stop_at_call_end: bool = True
    _stop_now: bool = False

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        self._stop_now = self.stop_at_call_end and bool(requests) and all(single_call(r) for r in requests)
        try:
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self._stop_now = False

    def _model_generate(self, context: Any, max_length: int, stop: list[str], **generation_kwargs: Any) -> Any:
        if not self._stop_now:
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        import torch

        generation_kwargs["temperature"] = generation_kwargs.get("temperature", 0.0)
        do_sample = generation_kwargs.get("do_sample")
        if (temp := generation_kwargs.get("temperature")) == 0.0 and do_sample is None:
            generation_kwargs["do_sample"] = do_sample = False
        if do_sample is False and temp == 0.0:
            generation_kwargs.pop("temperature", None)
        criteria = stop_sequences_criteria(self.tokenizer, stop, context.shape[1], context.shape[0])
        criteria.append(make_stopping_criteria(self.tokenizer, context.shape[1], context.shape[0], stop))
        with torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                            enabled=self.mixed_precision_dtype is not None):
            return self.model.generate(input_ids=context, max_length=max_length, stopping_criteria=criteria,
                                       pad_token_id=self.tokenizer.pad_token_id, use_cache=True,
                                       **generation_kwargs)
