"""Whether an adapter view verifies the base's answers or decodes as the base did: one rule for every flow.

A verified view reads the adapter's tokens from one teacher-forced pass over prompt + draft; the base's
come from step-by-step decoding. In float32 the two agree token for token (tested) and verification is
cheaper on CPU, so it is the default there. In half precision (float16/bfloat16 weights, or lm-eval's
autocast dtype) they round differently: near ties flip, and an adapter that changes nothing "changes"
answers (how many: docs/performance.md, "Half precision"). Decoding the adapter's
view the way the base's was decoded keeps both views on the same arithmetic (a zero LoRA delta adds
exactly nothing), so half precision decodes by default. ``verify: true`` (``--verify``) forces
verification anyway (its near ties are counted and printed); ``verify: false`` (``--no-verify``) decodes
in every dtype.

The rule is applied by toolfid's model class (:class:`~lm_eval_toolfid.integrations.lm_eval.hf_model.ToolfidHFLM`), the
one place that knows the dtype, for ``toolfid run``, ``toolfid lm-eval`` and ``--model toolfid-hf`` alike;
each request's generation record carries the decision and its reason (``verify``, ``verify_reason``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HALF_PRECISION = ("float16", "bfloat16")


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class VerifyChoice:
    """How an adapter view's tokens are obtained, and why."""

    verify: bool
    reason: str


def choose_verify(requested: bool | None, dtype: Any) -> VerifyChoice:
    """``requested``: the ``verify`` setting (None: not given); ``dtype``: the dtype the logits are computed in."""
    name = dtype_name(dtype)
    half = name in HALF_PRECISION
    if requested is False:
        return VerifyChoice(False, "decoded: --no-verify (metadata verify: false)")
    if requested is True:
        if half:
            return VerifyChoice(True, f"verified: --verify (metadata verify: true) forces it in {name}, where a "
                                      "verified pass rounds differently from decoding (near ties counted)")
        return VerifyChoice(True, f"verified: --verify (metadata verify: true); {name} verification is exact")
    if half:
        return VerifyChoice(False, f"decoded as the base view was: in {name} a verified pass rounds differently "
                                   "from decoding (--verify forces it)")
    return VerifyChoice(True, f"verified against the base's answers: exact in {name} and cheaper than decoding "
                              "(--no-verify decodes)")


def combine_requests(a: bool | None, b: bool | None) -> bool | None:
    """Two requests for the same prompt: decoding wins, then an explicit ``verify: true``, then the default."""
    if a is False or b is False:
        return False
    if a is True or b is True:
        return True
    return None
