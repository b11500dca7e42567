"""Prompts that do not fit: a case whose prompt plus its generation budget (``max_gen_toks``) is longer than the
model's context is refused in one line before anything is generated, naming the cases and their lengths (lm-eval
would cut the prompt's start off silently, and the answers would be the model's reply to half a request)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from lm_eval_toolfid.core.errors import ToolfidError

SHOWN = 5
"""Cases named in the message (the rest counted)."""


def too_long(requests: Sequence[Any], encode: Callable[[str], list[int]], context: int,
             default_budget: int) -> list[tuple[str, int, int]]:
    """``(case id, prompt tokens, generation budget)`` of each request whose prompt and budget exceed ``context``
    tokens (each prompt counted once)."""
    out, seen = [], set()
    for request in requests:
        prompt = request.args[0]
        if prompt in seen or not isinstance(prompt, str):
            continue
        seen.add(prompt)
        kwargs = request.args[1] if len(request.args) > 1 and isinstance(request.args[1], dict) else {}
        budget = int(kwargs.get("max_gen_toks", default_budget))
        n = len(encode(prompt))
        if n + budget > context:
            doc = getattr(request, "doc", None)
            out.append((str(doc.get("id")) if isinstance(doc, dict) else f"#{len(seen)}", n, budget))
    return out


def check_prompts_fit(requests: Sequence[Any], encode: Callable[[str], list[int]], context: int,
                      default_budget: int) -> None:
    """One line (exit 4) when any case's prompt and generation budget do not fit ``context`` tokens."""
    over = too_long(requests, encode, context, default_budget)
    if not over:
        return
    shown = ", ".join(f"{cid} ({n:,} prompt + {budget} generated tokens)" for cid, n, budget in over[:SHOWN])
    more = f" and {len(over) - SHOWN} more" if len(over) > SHOWN else ""
    raise ToolfidError(f"{len(over)} case(s) do not fit the model's context of {context:,} tokens: {shown}{more}; "
                       "shorten their prompts (fewer tools or demonstrations: --demos 0) or remove them from the "
                       "case file")
