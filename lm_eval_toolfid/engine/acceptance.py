"""Token acceptance: every token the engine emits goes through :func:`take_token` (near ties counted, the stop rules
asked), and a pass's predictions for a row are walked against its draft by :func:`accept_predictions`."""

from __future__ import annotations

from typing import Sequence

from lm_eval_toolfid.engine.handoffs import RowState
from lm_eval_toolfid.engine.rows import LiveRow, Row, RowResult


def take_token(res: RowResult, row: Row, token: int, gap: float, *, verified: bool, near_tie: float,
               record: bool) -> bool:
    """Emit one token (the model's argmax; ``gap``: its top-two logit gap) into a row's result; True when the row
    stops there.

    ``verified``: read from a draft pass (counted, and a near tie when ``gap < near_tie``); otherwise a token of a
    row on a shared prefix is a near tie on that prefix below the same bound. ``record``: keep the gap. The row
    stops when its stopper says so (EOS, ``until``, the end of the call) or its budget is spent — or, for a row
    that runs on, when its run-on stopper says so."""
    if verified:  # read from a draft pass, not computed the way plain decoding computes it
        res.verified += 1
        if gap < near_tie:
            res.near_ties += 1
    else:
        if res.shared and gap < near_tie:  # computed on a shared prefix's KV
            res.shared_near_ties += 1
        if res.joint and gap < near_tie:  # computed in a batch with other views' rows
            res.joint_near_ties += 1
        if res.lora and gap < near_tie:  # the stacked LoRA computation, not PEFT's forward
            res.lora_near_ties += 1
    res.tokens.append(token)
    if record:
        res.gaps.append(gap)
    n = len(res.tokens)
    if res.stopped_at is None:
        reason = row.stopper.push(token)
        if reason is None and n >= row.max_new:
            reason = "length"
        if reason is not None:
            res.finish, res.stopped_at = reason, n
    if row.run_on is None:
        return res.stopped_at is not None
    over = row.run_on.push(token) or ("length" if n >= row.max_new else None)
    if over is not None:
        res.run_on_finish = over
    return over is not None


def accept_predictions(live: LiveRow, preds: Sequence[tuple[int, float]], *, verified: bool, near_tie: float,
                       record: bool) -> RowState:
    """Walk the predictions ``(token, gap)`` for the row's next generated positions (from ``len(tokens)`` on);
    ``verified``: they come from a draft pass (else from the prompt pass, as in plain decoding).

    Draft token *j* is accepted while every token before it was and the prediction equals it. Returns ``DONE``
    (the row stopped), ``VERIFY`` (every draft token so far accepted and the draft goes on beyond this pass: its
    next chunk is verified) or ``DECODE`` (the row continues by decode steps from ``live.pending``)."""
    res, row = live.result, live.row
    draft = row.draft
    for j, (token, gap) in enumerate(preds, start=len(res.tokens)):
        if j < len(draft) and j == len(res.tokens) and token == draft[j] and j == res.accepted:
            res.accepted += 1
        if take_token(res, row, token, gap, verified=verified, near_tie=near_tie, record=record):
            return RowState.DONE
        if res.accepted < len(res.tokens):  # diverged here: this token is the model's own choice
            live.pending = token
            return RowState.DECODE
    # every prediction matched a draft token, and the draft goes on beyond this pass
    assert res.accepted == len(res.tokens) <= len(draft)
    return RowState.VERIFY
