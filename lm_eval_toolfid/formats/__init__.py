"""Tool-call surface formats: text → calls (:func:`parse_calls`), call → text (:func:`render_call`).

One module per format (``bare_json``, ``fenced``, ``embedded``, ``hermes``, ``qwen_xml``,
``llama``, ``mistral``, ``openai``, ``pythonic``), a registry of renderable format names
(:data:`FORMATS`), and a driver that tries them in a fixed order. Every search is linear in the
(capped) text; see :mod:`.limits` and ``docs/formats.md``.
"""

from lm_eval_toolfid.core.jsonsafe import bounded_copy
from lm_eval_toolfid.formats.driver import parse_calls
from lm_eval_toolfid.formats.limits import (
                     DECODE_BUDGET,
                     MAX_CALLS,
                     MAX_DECODES,
                     MAX_DEPTH,
                     PYTHONIC_CAP,
                     SCAN_CAP,
                     safe_loads,
)
from lm_eval_toolfid.formats.registry import FORMATS, REGISTRY, Format, render_call, render_calls
from lm_eval_toolfid.formats.scan import spans

__all__ = ["parse_calls", "render_call", "render_calls", "FORMATS", "REGISTRY", "Format", "bounded_copy", "safe_loads", "spans",
           "SCAN_CAP", "MAX_CALLS", "MAX_DEPTH", "MAX_DECODES", "DECODE_BUDGET", "PYTHONIC_CAP"]
