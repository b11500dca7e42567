"""Yes/no settings as every flow passes them: one parser for ``--model_args``, ``--metadata``, the task's settings
and ``toolfid run``'s views (a bool, or the text lm-eval's argument strings carry)."""

from __future__ import annotations

from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError

TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
"""The spellings pydantic accepts for a bool, so a setting means the same in every flow."""


def parse_flag(value: Any, name: str, default: bool | None = None) -> bool | None:
    """``value`` as True/False; ``default`` when it is not given (None or empty); anything else is a one-line
    error naming the setting."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if not text:
        return default
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ToolfidError(f"{name}={value!r} is neither true nor false: give {name}=true or {name}=false")
