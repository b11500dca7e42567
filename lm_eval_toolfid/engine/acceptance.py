"""Token acceptance: every token the engine emits goes through :func:`take_token` (near ties counted, the stop rules
asked), and a pass's predictions for a row are walked against its draft by :func:`accept_predictions`.

A verified row whose predictions match its draft takes those tokens in bulk when its stopper can say, for the draft,
what it answers at each token (``decisions``: a walk shared by every row verifying the same draft under the same
rules, e.g. the same case in a hundred adapter views): the same tokens, counts, gaps and stop as token by token, the
stopper's own pushes deferred until it is asked again (:attr:`RowResult.deferred`)."""

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
    if res.deferred and res.stopped_at is None:
        catch_up(res, row)
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
    if verified and row.run_on is None and res.stopped_at is None and res.accepted == len(res.tokens):
        preds = _take_matching(res, row, preds, near_tie, record)
        if res.stopped_at is not None:
            return RowState.DONE
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


def catch_up(res: RowResult, row: Row) -> None:
    """Push the row's deferred tokens into its stopper (their decisions were read from the draft's shared walk: none
    stopped the row)."""
    for token in res.tokens[len(res.tokens) - res.deferred:]:
        row.stopper.push(token)
    res.deferred = 0


def _take_matching(res: RowResult, row: Row, preds: Sequence[tuple[int, float]], near_tie: float,
                   record: bool) -> Sequence[tuple[int, float]]:
    """The leading predictions that equal the draft, taken at once as :func:`take_token` would take them one by one
    (verified, near ties counted, gaps kept, the row stopped where its stopper or budget stops it); returns the
    predictions left for the token-by-token walk (the first one that diverges, and those after it). Only where the
    row's stopper gives its ``decisions`` over the draft; otherwise every prediction is left."""
    decisions = getattr(row.stopper, "decisions", None)
    draft, start = row.draft, len(res.tokens)
    m = 0
    limit = min(len(preds), len(draft) - start)
    while m < limit and preds[m][0] == draft[start + m]:
        m += 1
    if m == 0 or decisions is None:
        return preds
    said = decisions(draft)
    take, reason = m, None
    for i in range(m):  # the first stop among them: the stopper's, else the budget's
        j = start + i
        reason = said[j] if j < len(said) else None
        if reason is None and j + 1 >= row.max_new:
            reason = "length"
        if reason is not None:
            take = i + 1
            break
    taken = preds[:take]
    res.tokens.extend(token for token, _ in taken)
    res.accepted += take
    res.verified += take
    res.near_ties += sum(1 for _, gap in taken if gap < near_tie)
    if record:
        res.gaps.extend(gap for _, gap in taken)
    if reason is not None:
        res.finish, res.stopped_at = reason, start + take
        res.deferred = 0  # a stopped row's stopper is never asked again
        return ()
    res.deferred += take
    return preds[take:]
