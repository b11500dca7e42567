"""Greedy decoding is the contract: which generation settings (the task's YAML with lm-eval's ``--gen_kwargs``
applied over it) do not decode greedily.

A verdict compares two views case by case; with sampling the same model gives other answers on another run, so a
difference says nothing about the adapter. A run whose settings sample is scored (its metrics are its own) but gets
no verdict and writes no base reference (:meth:`~lm_eval_toolfid.integrations.lm_eval.fidelity_run.FidelityRun.withhold`);
``toolfid compare`` marks it.

What counts as sampling, whatever the backend (each engine reads these differently: vLLM and OpenAI-compatible servers
sample at any temperature > 0 whatever ``do_sample`` says, transformers ignores ``temperature`` without
``do_sample``): ``do_sample`` true, a ``temperature`` above 0, ``top_p`` below 1, ``top_k`` above 0, ``min_p`` above
0 (each of these last only with ``do_sample`` or a temperature, as they filter a sample), and beam search
(``num_beams`` > 1: not the model's greedy choice either).
"""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.flags import parse_flag


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def not_greedy(gen_kwargs: dict[str, Any] | None) -> list[str]:
    """The settings in ``gen_kwargs`` that make decoding other than greedy, as ``key=value`` (empty: greedy)."""
    gen = dict(gen_kwargs or {})
    out: list[str] = []
    try:
        do_sample = parse_flag(gen.get("do_sample"), "do_sample")
    except Exception:  # noqa: BLE001 - an odd spelling is named, not guessed
        do_sample = True
    if do_sample:
        out.append(f"do_sample={gen.get('do_sample')}")
    temperature = _number(gen.get("temperature"))
    if temperature is not None and temperature > 0:
        out.append(f"temperature={gen.get('temperature')}")
    if out:  # the filters of a sample
        for key, greedy_value, worse in (("top_p", 1.0, lambda v: v < 1.0), ("top_k", 0.0, lambda v: v > 0),
                                         ("min_p", 0.0, lambda v: v > 0)):
            value = _number(gen.get(key))
            if value is not None and worse(value):
                out.append(f"{key}={gen.get(key)}")
    beams = _number(gen.get("num_beams"))
    if beams is not None and beams > 1:
        out.append(f"num_beams={gen.get('num_beams')}")
    return out


def sampling_reason(settings: list[str]) -> str:
    """One line saying why a run with these settings (:func:`not_greedy`'s) is given no verdict."""
    return (f"generation settings {', '.join(settings)} do not decode greedily (from --gen_kwargs or the task's "
            "generation_kwargs): sampled answers differ from run to run, so they cannot show what the adapter "
            "changed. Drop those settings (the task decodes greedily)")
