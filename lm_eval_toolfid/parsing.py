"""Compatibility re-export: the parser lives in :mod:`lm_eval_toolfid.formats`."""

from .formats import FORMATS, bounded_copy, parse_calls, render_call  # noqa: F401
