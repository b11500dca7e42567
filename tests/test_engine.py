"""The greedy engine (engine/decoding.py and its stages) on the bundled fixture model and its three adapters.

Exactness is the contract: the engine's plain path gives ``generate``'s tokens; verification of a
draft (the base's tokens, a wrong draft, a cut one) gives the plain path's tokens, case by case,
whatever the batch, chunk and prefill sizes. Then the same through ``toolfid run`` (verified vs
``verify: false``) and the two-run ``lm_eval`` flow (``toolfid lm-eval``, drafts from the stored
reference).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

MAX_NEW = 96
UNTIL = ["\n###"]


@pytest.fixture(scope="module")
def fixture_model() -> dict[str, Any]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import render_prompt
    from lm_eval_toolfid.prompts.settings import PromptSettings

    torch.set_num_threads(1)
    paths = fixture_paths()
    tok = AutoTokenizer.from_pretrained(paths["base"])
    model = AutoModelForCausalLM.from_pretrained(paths["base"])
    names = list(paths["adapters"])
    model = PeftModel.from_pretrained(model, paths["adapters"][names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(paths["adapters"][name], adapter_name=name)
    model.eval()
    cases = load_cases("fixture")[::2]  # every other case: single requests and conversations alike
    # zero-demo prompts (what the fixture was trained on) and one-demo prompts (longer, other outputs)
    prompts = [render_prompt(c, PromptSettings(demos=d)) for d in (0, 1) for c in cases]
    ids = [tok(p)["input_ids"] for p in prompts]  # tokenized once: every _rows call copies them
    return {"model": model, "tok": tok, "prompts": prompts, "ids": ids, "adapters": names, "runs": {}}


def _once(fx: dict[str, Any], key: tuple, compute: Any) -> Any:
    """A run several tests compare against, computed once per module (the same model, rows and engine settings give
    the same tokens: recomputing them checked nothing more)."""
    if key not in fx["runs"]:
        fx["runs"][key] = compute()
    return fx["runs"][key]


def _plain_run(fx: dict[str, Any], view: str | None, call_end: bool = True,
               rows: slice | list[int] = slice(None)) -> tuple[list[Any], Any]:
    """The engine's plain decoding of every row under ``view`` (``max_batch`` 8, shared prefixes, gaps recorded), and
    the run's stats: the reference of the verification tests, what test_plain_engine_gives_generates_tokens compares
    with ``generate`` and the shared side of test_shared_prefixes_give_the_tokens_of_whole_prompts. (Every fixture
    row starts on a shared prefix, so its tokens are picked with their top-two gaps whether or not they are kept:
    ``record_gaps`` only keeps them.) ``rows``: a subset of the rows, run alone (the runs without the call-end rule,
    which no other test reads)."""
    def run() -> tuple[list[Any], Any]:
        with _view(fx, view):
            engine = _engine(fx, max_batch=8, record_gaps=True)
            return engine.run(_pick(_rows(fx, call_end=call_end), rows)), engine.stats
    return _once(fx, ("plain", view, call_end, repr(rows)), run)


def _plain(fx: dict[str, Any], view: str | None, call_end: bool = True,
           rows: slice | list[int] = slice(None)) -> list[Any]:
    return _plain_run(fx, view, call_end, rows)[0]


def _verified_on_base(fx: dict[str, Any], view: str | None, base_tokens: list[list[int]],
                      rows: slice | list[int] = slice(None)) -> list[Any]:
    """``view`` verifying the base's answers (``max_batch`` 8, the default draft budget, gaps recorded): the first
    schedule of test_verified_equals_plain_for_every_adapter_and_schedule and the verified side of
    test_shared_prefixes_give_the_tokens_of_whole_prompts (all rows); ``rows`` a subset of the rows, run alone
    (test_acceptance_follows_how_close_the_adapter_is: the odd rows)."""
    def run() -> list[Any]:
        with _view(fx, view):
            return _engine(fx, max_batch=8, record_gaps=True).run(_pick(_rows(fx, base_tokens), rows))
    return _once(fx, ("verified on base", view, repr(rows)), run)


def _rows(fx: dict[str, Any], drafts: list[list[int]] | None = None, call_end: bool = True) -> list[Any]:
    from lm_eval_toolfid.engine.decoding import Row
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper, eos_token_ids

    tok = fx["tok"]
    eos = eos_token_ids(fx["model"], tok)
    return [Row(prompt=list(ids), max_new=MAX_NEW, draft=drafts[i] if drafts else (),
                stopper=RowStopper(tok, eos, UNTIL, MAX_NEW, call_end=call_end))
            for i, ids in enumerate(fx["ids"])]


def _engine(fx: dict[str, Any], model: Any = None, **config: Any) -> Any:
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine

    return GreedyEngine(model if model is not None else fx["model"], fx["tok"].pad_token_id, EngineConfig(**config))


def _view(fx: dict[str, Any], name: str | None) -> Any:
    import contextlib

    if name is None:
        return fx["model"].disable_adapter()
    fx["model"].set_adapter(name)
    return contextlib.nullcontext()


def _generate(fx: dict[str, Any], call_end: bool, batch: int = 8,
              rows: slice | list[int] = slice(None)) -> list[list[int]]:
    """Today's path: transformers' generate, left-padded batches, the per-row call-end criterion."""
    import torch
    from transformers import StoppingCriteriaList

    from lm_eval_toolfid.integrations.lm_eval.stopping import make_stopping_criteria

    tok, model = fx["tok"], fx["model"]
    tok.padding_side = "left"
    prompts = _pick(fx["prompts"], rows)
    out = []
    for b in range(0, len(prompts), batch):
        enc = tok(prompts[b:b + batch], return_tensors="pt", padding=True)
        criteria = StoppingCriteriaList(
            [make_stopping_criteria(tok, enc.input_ids.shape[1], enc.input_ids.shape[0], UNTIL)] if call_end else [])
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False, stopping_criteria=criteria,
                                 pad_token_id=tok.pad_token_id)
        out.extend(gen[:, enc.input_ids.shape[1]:].tolist())
    return out


PAIRS = [(True, None), (False, None), (True, "hallucinating"), (False, "broken")]
SLOW_PAIR = (True, "hallucinating")
"""Both its halves run with the slow tests (its 72-row plain run is the slow verification tests' reference; 3.5 s of
CPU in the quick tier, read by this pair alone there): the quick tier keeps the call-end rule on the base
(``(True, None)``) and LoRA layers in every forward (``(False, broken)``; faithful in
test_drafts_rejected_early_stop_drafting_and_rows_decode_as_plain, hallucinating verifying in
test_acceptance_follows_how_close_the_adapter_is)."""


@pytest.mark.parametrize("call_end,view,half",
                         [pytest.param(*pair, "odd", marks=[pytest.mark.slow] * (pair == SLOW_PAIR)) for pair in PAIRS]
                         + [pytest.param(*pair, "even", marks=pytest.mark.slow) for pair in PAIRS])
def test_plain_engine_gives_generates_tokens(fixture_model: dict, view: str | None, call_end: bool,
                                             half: str) -> None:
    """Engine (continuous batching, rows leaving, in-place cache) == transformers' generate, per case.

    Four of the eight (view, stop rule) pairs: the base both ways, an adapter whose calls end early (another tool:
    the call-end rule, LoRA layers in the forward) and one answering prose (no call ends it: EOS, ``until`` or the
    budget). The faithful adapter answers as the base does and runs the same code; its verification is
    checked below (test_verified_equals_plain_for_every_adapter_and_schedule, test_acceptance_...).

    Each pair's 72 rows are checked in two halves: the 36 odd rows (ODD_ROWS, below: both demo counts, requests and
    conversations, every near tie and EOS row of NEAR_TIES_AND_EOS) in the quick tier (SLOW_PAIR's with the slow
    tests too), the 36 even rows with the slow tests. With the call-end rule the engine's run is the one the verification tests read, over all 72 rows
    (``_plain``), read at the half's rows; without it (no other test reads those runs) the half runs alone, still
    4.5 times ``max_batch``, so rows leave and others take their slots throughout. ``generate`` runs on the half.
    Both halves end the same ways: without the call-end rule the base ends every row by ``until`` (2 tokens past its
    call), and broken ends 4 rows of each half by EOS (61, 65, 67, 69; 32, 66, 68, 70 — asserted below)."""
    rows = ODD_ROWS if half == "odd" else slice(0, None, 2)
    if call_end:  # the reference of the verification tests below, at the half's rows
        ours = _pick(_plain(fixture_model, view, call_end), rows)
    else:
        ours = _plain(fixture_model, view, call_end, rows)
    with _view(fixture_model, view):
        theirs = _generate(fixture_model, call_end, rows=rows)
    assert len(ours) == len(theirs) == 36
    eos = set(_rows(fixture_model)[0].stopper.eos_ids)
    for i, (r, g) in enumerate(zip(ours, theirs)):
        assert r.tokens == g[:len(r.tokens)], f"case {i}: engine {r.tokens[:20]} vs generate {g[:20]}"
        rest = g[len(r.tokens):]
        if r.finish == "eos":  # generate stopped there too: only padding follows
            assert set(rest) <= {fixture_model["tok"].pad_token_id}, i
        assert r.finish in ("eos", "stop", "length")
        assert r.finish != "length" or len(r.tokens) == MAX_NEW
    assert all(r.tokens[-1] in eos for r in ours if r.finish == "eos")
    if call_end and view != "broken":  # most calls end well before the budget
        assert sum(r.finish == "stop" for r in ours) > len(ours) // 2
    if view == "broken":  # the subset keeps rows that only EOS ends (a path the call-end runs do not take)
        assert sum(r.finish == "eos" for r in ours) >= 4


@pytest.fixture(scope="module")
def base_tokens(fixture_model: dict) -> list[list[int]]:
    return [r.tokens for r in _plain(fixture_model, None)]


# Rows (of the 72: 0-35 zero demos, 36-71 one demo; 24-35 and 60-71 conversations) where the paths bite, measured on
# the fixture in float32: top-two gaps below the near-tie bound (0.001) at rows 9, 27 and 69 (hallucinating) and 55
# (the base, whose answers are the drafts); EOS ends row 41 (hallucinating) and 8 of broken's, among them 61, 65, 67
# and 69 (the other rows end by the call-end rule, at 13-44 tokens).
NEAR_TIES_AND_EOS = [9, 27, 41, 55, 61, 65, 67, 69]
ODD_ROWS = slice(1, None, 2)
"""Rows of the small-batch schedule: 36 of the 72, both demo counts, requests and conversations, and every row of
NEAR_TIES_AND_EOS (all odd). With 3 rows a pass it takes 2.7 times the passes of 8 rows a pass; its chunks and
budgets act per row (refills at every freed slot with any number of rows past 3), so the other half repeated them."""
ONE_AT_A_TIME = [0, 9, 21, 27, 30, 41, 48, 55, 61, 64, 66, 69]
"""Rows of the one-row-at-a-time schedule: 12 of the 72 (both demo counts, requests and conversations, every row of
NEAR_TIES_AND_EOS but 65 and 67) — with one row per pass no row meets another, so more rows repeat the same
passes."""

SCHEDULES = [  # (engine config, the drafts it is tried with, the rows)
    ({"max_batch": 8}, ("base", "cut", "random", "own"), slice(None)),
    ({"max_batch": 3, "first_chunk": 2, "verify_logits": 5 * 1729, "prefill_tokens": 300}, ("base", "cut"), ODD_ROWS),
    # 8-token chunks; 72 rows for 64 slots: the last 8 are admitted one at a time as slots free (refill 1)
    ({"max_batch": 64, "first_chunk": 1, "verify_logits": 1, "refill": 1}, ("base", "random"), slice(None)),
    ({"max_batch": 1, "prefill_tokens": 1}, ("base",), ONE_AT_A_TIME),  # one row at a time
]


def _odd_rows(fx: dict[str, Any], drafts: list[list[int]]) -> list[Any]:
    """The ODD_ROWS rows (fresh stoppers), each with its draft: ``drafts`` lists the odd rows' drafts in order."""
    rows = _pick(_rows(fx), ODD_ROWS)
    for row, draft in zip(rows, drafts, strict=True):
        row.draft = draft
    return rows


def _pick(items: list, which: slice | list[int]) -> list:
    return items[which] if isinstance(which, slice) else [items[i] for i in which]


@pytest.mark.slow
@pytest.mark.parametrize("view", ["faithful", "hallucinating", "broken"])
def test_verified_equals_plain_for_every_adapter_and_schedule(fixture_model: dict, base_tokens: list, view: str) -> None:
    """Verifying the base's tokens (right, cut, or wrong drafts) never changes an adapter's output.

    The reference is the view's plain decoding at ``max_batch`` 8, computed once per module (``_plain``: the run
    test_plain_engine_gives_generates_tokens compares with ``generate``); the one-row-at-a-time schedule below
    (``max_batch`` 1, one prompt token per pass) keeps a schedule that shares nothing with it: no other row in a
    pass, no padding, no slot moved. (Plain decoding one row at a time over all 72 rows was the reference before:
    8-9 s a view, and the same tokens.) The first schedule's base drafts are the run
    test_shared_prefixes_give_the_tokens_of_whole_prompts reads (``_verified_on_base``).

    Slow tier (about 15 s a view on one core): the not-slow tier checks verification against plain decoding on
    wrong drafts in test_drafts_rejected_early_stop_drafting_and_rows_decode_as_plain and acceptance per adapter in
    test_acceptance_follows_how_close_the_adapter_is."""
    rng = random.Random(0)
    plain = [r.tokens for r in _plain(fixture_model, view)]
    drafts = {
        "base": base_tokens,
        "cut": [d[:rng.randint(0, len(d))] for d in base_tokens],
        "random": [[rng.randrange(1, 1700) for _ in range(6)] for _ in base_tokens],
        "own": plain,  # the adapter's own answer: every row is answered by verification alone
    }
    for config, kinds, rows in SCHEDULES:
        for kind in kinds:
            if config == SCHEDULES[0][0] and kind == "base":
                out = _verified_on_base(fixture_model, view, base_tokens)
            else:
                with _view(fixture_model, view):
                    out = _engine(fixture_model, **config).run(_pick(_rows(fixture_model, drafts[kind]), rows))
            differ = [i for i, (r, p) in enumerate(zip(out, _pick(plain, rows))) if r.tokens != p]
            assert not differ, f"{view} {kind} {config}: cases {differ[:5]} differ"
            if kind == "own":
                assert all(r.decoded == 0 and r.accepted == len(r.tokens) for r in out)


def _same_or_near_tie(a: Any, b: Any, what: str) -> int:
    """Rows of two runs (with ``record_gaps``): the same tokens, or a first difference where either run's
    top-two logit gap was below the engine's near-tie tolerance. Returns how many rows differ (near ties)."""
    from lm_eval_toolfid.engine.decoding import NEAR_TIE

    differ = 0
    for i, (x, y) in enumerate(zip(a, b)):
        if x.tokens == y.tokens:
            continue
        j = next((k for k, (s, t) in enumerate(zip(x.tokens, y.tokens)) if s != t), min(len(x.tokens), len(y.tokens)))
        gap = min(x.gaps[j] if j < len(x.gaps) else 1.0, y.gaps[j] if j < len(y.gaps) else 1.0)
        assert gap < NEAR_TIE, f"{what}: case {i} differs at token {j} (top-two gap {gap:.3g}): not a near tie"
        differ += 1
    return differ


@pytest.mark.slow
@pytest.mark.parametrize("view", [None, "hallucinating", "prose_after_results"])
def test_shared_prefixes_give_the_tokens_of_whole_prompts(fixture_model: dict, base_tokens: list,
                                                          view: str | None) -> None:
    """Prompt prefixes that rows share computed once per view (the default) against every prompt computed
    whole: the same tokens for every row, decoded and verified, unless at a near tie (none on the fixture);
    fewer prompt tokens computed.

    The base, an adapter that leaves the base's call (decoded past the first token under its own LoRA on the
    shared prefix) and the one adapter no other engine test decodes (prose after results). Sharing is the default,
    so every other engine test here (faithful and broken included) runs on shared prefixes against ``generate``
    or the one-row-at-a-time plain path; this test adds the prompts computed whole and the counts."""
    with _view(fixture_model, view):
        whole_engine = _engine(fixture_model, max_batch=8, share_prefixes=False, record_gaps=True)
        whole = whole_engine.run(_rows(fixture_model))
    # the shared and verified runs are the module's (_plain_run, _verified_on_base): the same settings
    shared, stats = _plain_run(fixture_model, view)
    verified = _verified_on_base(fixture_model, view, base_tokens)
    whole_stats = whole_engine.stats
    assert whole_stats.shared_tokens == 0 and whole_stats.prompt_tokens == whole_stats.prompt_tokens_total
    assert stats.prefix_nodes > 0 and stats.shared_tokens > 0
    # every prompt token is computed once: by a shared prefix's pass or by the row's own pass
    assert stats.prompt_tokens < 0.6 * whole_stats.prompt_tokens
    assert sum(r.shared for r in shared) == stats.shared_tokens
    assert _same_or_near_tie(shared, whole, f"{view} shared") == 0
    assert _same_or_near_tie(verified, whole, f"{view} verified") == 0


def test_gpu_copies_and_rows_leaving_together_give_the_same_tokens(fixture_model: dict, base_tokens: list) -> None:
    """The copies a GPU makes (every row a pass leaves joining, or a shared prefix going into a pass, in one
    indexed copy per buffer), and rows stopping in the same step (budgets that end together, the rows behind
    them moving into their slots at once): the same tokens, row by row."""
    from lm_eval_toolfid.engine.decode_batch import DecodeBatch

    moved: list[int] = []
    real = DecodeBatch._release

    def spy(self, done):  # noqa: ANN001, ANN202
        moved.append(sum(1 for b in done if b < len(self.rows) - len(done)))
        return real(self, done)

    budgets = [3 + 4 * (i % 3) for i in range(len(base_tokens))]
    with _view(fixture_model, None), pytest.MonkeyPatch.context() as mp:
        mp.setattr(DecodeBatch, "_release", spy)
        engine = _engine(fixture_model, max_batch=64)
        engine.kv.indexed_copies = True
        out = engine.run(_rows(fixture_model))
        rows = _rows(fixture_model)
        for row, budget in zip(rows, budgets):
            row.max_new = row.stopper.max_new = budget
        cut = _engine(fixture_model, max_batch=64).run(rows)
    assert [r.tokens for r in out] == base_tokens
    assert [r.tokens for r in cut] == [t[:b] for t, b in zip(base_tokens, budgets)]
    assert max(moved) > 1  # several rows moved in one step


def test_drafts_are_verified_in_passes_of_like_length(fixture_model: dict, base_tokens: list,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A verification pass reads its rows' KV up to the longest prompt among them, so rows admitted together
    (sorted by prompt when prefixes are shared, not by length) go to passes of like length within the padded
    budget, as prompt passes do; the tokens stay plain decoding's."""
    from lm_eval_toolfid.engine.draft_verify import DraftVerifier

    groups: list[list[int]] = []
    real = DraftVerifier.verify

    def spy(self, group):  # noqa: ANN001, ANN202
        groups.append([len(d.live.row.prompt) for d in group])
        return real(self, group)

    monkeypatch.setattr(DraftVerifier, "verify", spy)
    config = {"max_batch": 16, "prefill_tokens": 600, "max_padding": 0.1}
    with _view(fixture_model, None):
        out = _engine(fixture_model, **config).run(_rows(fixture_model, base_tokens))
    assert [r.tokens for r in out] == base_tokens
    assert sum(map(len, groups)) == len(base_tokens) and len(groups) > 1
    for lengths in groups:
        padded = max(lengths) * len(lengths)
        assert len(lengths) == 1 or (padded <= 600 and padded - sum(lengths) <= 0.1 * padded), lengths


def test_acceptance_follows_how_close_the_adapter_is(fixture_model: dict, base_tokens: list) -> None:
    """Each adapter (and the base) verifying the base's answers, on the 36 odd rows (ODD_ROWS: both demo counts,
    requests and conversations, every near tie and EOS row of NEAR_TIES_AND_EOS): the share of draft tokens accepted
    follows how close the adapter is, and every row's counts add up. The runs over all 72 rows are the slow
    verification tests' (``_verified_on_base``); these are runs of their own, at the same settings (``max_batch`` 8,
    so rows still leave and refill), and verification is exact whatever the rows (those tests check it)."""
    rates = {}
    odd = _pick(base_tokens, ODD_ROWS)
    for view in fixture_model["adapters"]:
        out = _verified_on_base(fixture_model, view, base_tokens, ODD_ROWS)
        assert len(out) == 36
        rates[view] = sum(r.accepted for r in out) / sum(len(r.tokens) for r in out)
        assert all(r.verified in (r.accepted - 1, r.accepted) or r.verified == r.accepted == 0 for r in out)
        assert all(1 + r.verified + r.decoded == len(r.tokens) for r in out)
    assert rates["faithful"] > rates["hallucinating"] > rates["broken"]
    assert rates["broken"] == 0.0
    out = _verified_on_base(fixture_model, None, base_tokens, ODD_ROWS)  # the base verifying itself: all accepted
    assert len(out) == 36 and all(r.tokens == b and r.decoded == 0 for r, b in zip(out, odd))


def test_drafts_rejected_early_stop_drafting_and_rows_decode_as_plain(fixture_model: dict) -> None:
    """Drafts whose first token is right and the rest wrong (a first verification pass gains one token of the 16
    it sends): after its probe rows the engine stops drafting and the other rows decode from their prompt pass —
    token for token plain decoding's (float32), in fewer passes than verifying every draft. The adapter's own
    answers as drafts (every token accepted) stay verified end to end.

    On the 36 odd rows (ODD_ROWS): past the 8 probe rows 28 rows are left to stop drafting for (more than half of
    them, asserted below), more than ``max_batch`` 16 so slots are refilled; the reference is the view's plain run
    over all 72 rows (read by the verification tests too), taken at the same rows."""
    rng = random.Random(0)
    plain = _pick([r.tokens for r in _plain(fixture_model, "faithful")], ODD_ROWS)  # shared with verification tests
    with _view(fixture_model, "faithful"):
        early = [p[:1] + [rng.randrange(1, 1700) for _ in range(len(p) - 1)] for p in plain]
        engine = _engine(fixture_model, max_batch=16)
        out = engine.run(_odd_rows(fixture_model, early))
        always = _engine(fixture_model, max_batch=16, draft_probe_rows=0)  # drafting never stops: before issue 37
        out_always = always.run(_odd_rows(fixture_model, early))
        own = _engine(fixture_model, max_batch=16)
        out_own = own.run(_odd_rows(fixture_model, plain))
    assert len(out) == len(out_own) == 36
    differ = [i for i, (r, p) in enumerate(zip(out, plain)) if r.tokens != p]
    assert not differ, f"cases {differ[:5]} differ from plain decoding"
    assert [r.tokens for r in out_always] == plain
    budget = engine.draft_budgets.by_view.get(None)  # the run's rows have no view
    assert budget is not None and budget.stop is not None
    assert budget.stop.after_rows == 8 and budget.stop.gain < 0.1  # judged on the probe rows alone
    drafted = [r for r in out if r.accepted]  # first token matched: every row that did not stop there
    dropped = [r for r in drafted if r.draft_dropped]
    assert len(drafted) - len(dropped) == 8 == sum(1 for r in out if r.verified) and budget.dropped == len(dropped)
    assert len(dropped) > len(out) // 2
    assert all(r.verified == 0 and r.accepted == 1 and r.decoded == len(r.tokens) - 1 for r in dropped)
    assert not any(r.draft_dropped for r in out_always) and always.draft_budgets.by_view[None].drafting
    assert engine.stats.forward_passes < always.stats.forward_passes
    assert engine.stats.padded_tokens < always.stats.padded_tokens
    # faithful drafts: every row verified, none decoded, drafting never stopped
    own_budget = own.draft_budgets.by_view[None]
    assert own_budget.drafting and own_budget.rows == len(out_own)
    assert all(r.tokens == p and r.decoded == 0 and not r.draft_dropped for r, p in zip(out_own, plain))


def test_toolfid_run_header_says_where_drafting_stopped(toolfid_home: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """`toolfid run --verbose` with an adapter whose drafts are rejected early (the fixture's hallucinating adapter:
    its first token is the base's, then it calls another tool) and a faithful one: the header line of the first says
    that drafting stopped and why; the faithful view stays verified throughout. (Without --verbose the screen leaves
    this account to the run's records: test_demo_output.py.)"""
    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cli import main

    paths = fixture_paths()
    out = tmp_path / "run"
    assert main(["run", "--base", paths["base"], "--adapter", paths["adapters"]["hallucinating"], "--adapter",
                 paths["adapters"]["faithful"], "--cases", "fixture", "--limit", "24", "--no-breakdown",
                 "--verbose", "--output", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    header = text.split("adapter valid")[0]
    results = {v: json.loads((out / v / "results.json").read_text()) for v in ("hallucinating", "faithful")}
    records = {v: _generation_record(r, next(iter(r["configs"]))) for v, r in results.items()}
    early, faithful = records["hallucinating"], records["faithful"]
    stop = early["drafting_stopped"]
    assert stop["after_rows"] == 8 and stop["gain"] < stop["min_gain"] == 0.4
    assert early["rows_draft_dropped"] > 0 and early["rows_verified"] + early["rows_draft_dropped"] == early["rows"]
    assert (f"tokens of hallucinating: verified against the base's answers: exact in float32 and cheaper than "
            f"decoding (--no-verify decodes); drafting stopped after 8 rows: drafts were rejected early (first "
            f"verification passes gained {stop['gain']:.0%} of the draft tokens they sent; drafting pays from 40%), "
            f"so {early['rows_draft_dropped']} of {early['rows']} rows were decoded instead") in header
    assert "drafting_stopped" not in faithful and faithful["rows_verified"] == faithful["rows"] == 24
    assert "tokens of faithful: verified against the base's answers: exact in float32 and cheaper than decoding " \
           "(--no-verify decodes)" in header and "faithful: verified against the base's answers: exact in float32 " \
           "and cheaper than decoding (--no-verify decodes);" not in header
    # and the share of tokens accepted, low because drafting stopped (above the table too, under --verbose)
    assert "cases without decoding; drafting stopped after 8 rows)" in header


# --- through toolfid run and the lm_eval flow ----------------------------------------------------

def _generations(view: Any) -> dict[str, str]:
    return {s["doc"]["id"]: s["resps"][0][0] for s in view.samples}


def _generation_record(results: dict, task: str = "tool_use_fidelity_fixture") -> dict:
    return results["configs"][task]["metadata"]["toolfid"]["generation"]


@pytest.mark.slow
def test_toolfid_run_verified_views_equal_unverified_ones(toolfid_home: Path, tmp_path: Path) -> None:
    """The same adapter views with and without verification: identical generations and records;
    the provenance says which views were verified and how their tokens were obtained. Faithful adapters are
    verified case by case; where drafts are rejected early (hallucinating) drafting stops after the probe rows and
    the rest decode (issue 37) — with the same generations as ``verify: false``."""
    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.run.plan import ModelOptions, RunPlan
    from lm_eval_toolfid.run.runner import run_plan

    paths = fixture_paths()
    adapters = dict(paths["adapters"])
    # every other fixture case (24 requests, 12 conversations; the whole set took twice as long and adds no path:
    # the drafting stop needs its 8 probe rows and more than half of the rows dropped, both kept)
    lines = Path(paths["cases"]).read_text(encoding="utf-8").splitlines()
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(line for line in lines[::2] if line.strip()) + "\n", encoding="utf-8")
    meta = {"cases": str(cases)}
    base_v, verified = run_plan(RunPlan(paths["base"], adapters, "tool_use_fidelity_fixture", meta,
                                        models=ModelOptions(batch_size=8), out_dir=tmp_path / "verified"))
    base_p, plain = run_plan(RunPlan(paths["base"], adapters, "tool_use_fidelity_fixture", {**meta, "verify": False},
                                     models=ModelOptions(batch_size=8), out_dir=tmp_path / "plain"))
    assert _generations(base_v) == _generations(base_p)
    n = len(base_v.samples)  # every case of the subset
    assert n == len(_generations(base_v)) == len(lines[::2]) == 36
    assert sum(1 for cid in _generations(base_v) if cid.startswith("fx-m")) == 12  # the conversations
    for v, p in zip(verified, plain):
        assert _generations(v) == _generations(p), v.label
        assert v.results["results"] == p.results["results"], v.label
        rec, prec = _generation_record(v.results), _generation_record(p.results)
        assert rec["engine"] == prec["engine"] == "toolfid"
        assert rec["verify"] is True and rec["rows_verified"] + rec["rows_draft_dropped"] == rec["rows"] == n
        assert rec["draft_sources"] == {"session": n}
        assert rec["tokens"] == prec["tokens"] == rec["tokens_verified"] + rec["tokens_decoded"] + rec["rows"]
        assert prec["verify"] is False and prec["rows_verified"] == 0 and prec["tokens_decoded"] + n == prec["tokens"]
        assert rec["near_tie_tokens"] == 0  # the fixture's logits never nearly tie at these positions
    by = {v.label: _generation_record(v.results) for v in verified}
    assert by["faithful"]["rows_answered_by_verification"] > 0
    for label in ("faithful", "prose_after_results"):  # drafts accepted: every case verified
        assert by[label]["rows_verified"] == n and by[label]["rows_draft_dropped"] == 0, label
        assert "drafting_stopped" not in by[label], label
    # drafts rejected early (the base's first token, then another tool): drafting stopped after the probe rows,
    # the rest decoded — the same generations as verify: false (asserted above)
    early = by["hallucinating"]
    stop = early["drafting_stopped"]
    assert stop["after_rows"] == 8 and stop["gain"] < stop["min_gain"], stop
    assert early["rows_draft_dropped"] > n // 2 and early["rows_verified"] + early["rows_draft_dropped"] == n
    # drafts rejected at the first token, which the prompt pass reads as plain decoding does: no verification pass
    # ran, so nothing was spent and there was nothing to stop
    assert by["broken"]["rows_verified"] == n and "drafting_stopped" not in by["broken"]
    assert by["broken"]["tokens_accepted"] == 0
    base_rec = _generation_record(base_v.results)
    assert base_rec["rows_verified"] == 0 and base_rec["tokens_decoded"] + n == base_rec["tokens"]


@pytest.mark.slow
def test_two_run_lm_eval_flow_verifies_from_the_stored_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """``toolfid lm-eval --model hf``: the adapter run finds the base reference at build time and
    verifies its text; generations equal the same run with verify false. Through the CLI's entry point in
    process (the flow, not the process, is what is tested here; tests/test_lm_eval_cli.py and
    tests/test_stop_flows.py run ``lm_eval`` itself as a subprocess)."""
    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cli import main

    paths = fixture_paths()
    monkeypatch.setenv("TOOLFID_HOME", str(tmp_path / "home"))

    def run(model_args: str, out: str, meta: dict | None = None) -> tuple[dict, dict[str, str]]:
        cmd = ["lm-eval", "--tasks", "tool_use_fidelity_fixture", "--model", "hf", "--model_args",
               model_args, "--output_path", str(tmp_path / out), "--log_samples", "--batch_size", "16",
               "--device", "cpu", "--limit", "24"]
        if meta:
            cmd += ["--metadata", json.dumps(meta)]
        code = main(cmd)
        assert code == 0, capsys.readouterr().err[-3000:]
        results = json.loads(sorted((tmp_path / out).rglob("results_*.json"))[-1].read_text())
        samples = [json.loads(line) for line in
                   sorted((tmp_path / out).rglob("samples_*.jsonl"))[-1].read_text().splitlines() if line]
        return results, {s["doc"]["id"]: s["resps"][0][0] for s in samples}

    base, _ = run(f"pretrained={paths['base']}", "base")
    assert base["config"]["model"] == "toolfid-hf"
    assert _generation_record(base)["engine"] == "toolfid"
    adapter = f"pretrained={paths['base']},peft={paths['adapters']['faithful']}"
    verified, gen_v = run(adapter, "verified")
    plain, gen_p = run(adapter, "plain", {"verify": False})
    assert gen_v == gen_p
    rec = _generation_record(verified)
    assert rec["draft_sources"] == {"reference": 24} and rec["tokens_accepted"] > 0
    assert _generation_record(plain)["rows_verified"] == 0
    assert verified["results"] == plain["results"]
    meta = verified["configs"]["tool_use_fidelity_fixture"]["metadata"]["toolfid"]
    assert meta["pairing"].startswith("reference store")


def _penalised_view(lm: Any, base: str, task: str, limit: int) -> tuple[dict, dict[str, str]]:
    """A fixture view with repetition_penalty in the generation config (the engine does not apply it)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import tasks_path

    lm.model.generation_config.repetition_penalty = 1.3
    manager = TaskManager(include_path=str(tasks_path()), include_defaults=False,
                          metadata={"pretrained": base, "write_reference": False})
    out = simple_evaluate(model=lm, model_args={"pretrained": base}, tasks=[task], task_manager=manager,
                          log_samples=True, bootstrap_iters=0, limit=limit)
    return out, {s["doc"]["id"]: s["resps"][0][0] for s in out["samples"][task]}


def test_settings_the_engine_does_not_apply_go_through_generate(toolfid_home: Path) -> None:
    """A generation config with a logits processor (HF applies repetition_penalty to greedy decoding
    too): the view goes through transformers' generate in lm-eval's batches, says so in its record,
    and answers exactly as lm-eval's own HFLM does."""
    import lm_eval.evaluator
    import torch
    from lm_eval.models.huggingface import HFLM

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.formats.call_end import truncate_call
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    torch.set_num_threads(1)
    lm_eval.evaluator.get_git_commit_hash = lambda: None
    base, task = fixture_paths()["base"], "tool_use_fidelity_fixture"

    def view(lm: Any) -> tuple[dict, dict[str, str]]:
        return _penalised_view(lm, base, task, 16)

    ours, got = view(ToolfidHFLM(pretrained=base, batch_size=8, device="cpu"))
    _, want = view(HFLM(pretrained=base, batch_size=8, device="cpu"))
    assert {k: truncate_call(v) for k, v in got.items()} == {k: truncate_call(v) for k, v in want.items()}
    record = _generation_record(ours)
    assert record["engine"] == "generate" and "repetition_penalty" in record["generate_reason"]


def test_generate_path_sizes_auto_from_memory_not_lm_evals_detection(toolfid_home: Path, capsys: Any) -> None:
    """``batch_size=auto`` on the generate path (a model or setting the engine does not fit): the batch comes
    from free memory, as on the engine's path — lm-eval's detection would print to stdout (breaking
    ``--json``) and run a forward pass at the model's whole context — and the answers are HFLM's."""
    import lm_eval.evaluator
    import torch
    from lm_eval.models.huggingface import HFLM

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.formats.call_end import truncate_call
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    torch.set_num_threads(1)
    lm_eval.evaluator.get_git_commit_hash = lambda: None
    base, task = fixture_paths()["base"], "tool_use_fidelity_fixture"

    def view(lm: Any) -> tuple[dict, dict[str, str]]:
        return _penalised_view(lm, base, task, 12)

    lm = ToolfidHFLM(pretrained=base, batch_size="auto", device="cpu")
    capsys.readouterr()
    ours, got = view(lm)
    printed = capsys.readouterr().out
    assert "Detecting largest batch size" not in printed and lm.batch_size_per_gpu == "auto"
    assert _generation_record(ours)["engine"] == "generate"
    _, want = view(HFLM(pretrained=base, batch_size=12, device="cpu"))  # the 12 rows in one batch, as auto sized them
    assert {k: truncate_call(v) for k, v in got.items()} == {k: truncate_call(v) for k, v in want.items()}


@pytest.mark.slow  # 3.6 s of CPU; the quick tier keeps test_toolfid_run_in_bfloat16_counts_and_prints_its_near_ties
def test_half_precision_schedule_differences_are_counted_near_ties(fixture_model: dict) -> None:
    """In bfloat16 the logits carry 8 significant bits: another schedule of the same forward (a shared
    prefix, a draft pass) rounds otherwise and flips tokens whose top two logits are a unit in the last
    place apart (measured: the fixture on CPU and on an H200, every difference at a gap <= 0.125). Such a
    difference must be a counted near tie under the engine's bfloat16 bound — with the float32 bound
    (0.001) it was silent.

    On the 36 odd rows (ODD_ROWS): measured on CPU, the three schedules differ from the reference on rows 9, 33,
    38, 41 (shared prefixes), 31, 33, 39, 62 (verified) and 31, 33 (verified on shared prefixes), every one at a gap
    of 0.0625; the odd rows keep differences in all three (9, 31, 33, 39, 41), and the run is still two passes of 16
    rows and a refilled third."""
    import torch
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.engine.decoding import NEAR_TIE, near_tie_for

    model = AutoModelForCausalLM.from_pretrained(fixture_paths()["base"], dtype=torch.bfloat16).eval()
    bound = near_tie_for(torch.bfloat16)
    assert bound > NEAR_TIE and _engine(fixture_model, model).near_tie == bound
    rows_ = _pick(_rows(fixture_model), ODD_ROWS)
    ref = _engine(fixture_model, model, max_batch=16, share_prefixes=False, record_gaps=True).run(rows_)
    drafts = [r.tokens for r in ref]
    gaps = []
    for how, config, rows in (("shared prefixes", dict(share_prefixes=True), _odd_rows(fixture_model, [()] * 36)),
                              ("verified", dict(share_prefixes=False), _odd_rows(fixture_model, drafts)),
                              ("verified, shared prefixes", dict(share_prefixes=True), _odd_rows(fixture_model, drafts))):
        out = _engine(fixture_model, model, max_batch=16, record_gaps=True, **config).run(rows)
        for i, (a, b) in enumerate(zip(ref, out)):
            if a.tokens == b.tokens:
                continue
            j = next(k for k, (x, y) in enumerate(zip(a.tokens + [-1], b.tokens + [-2])) if x != y)
            gap = max(a.gaps[j], b.gaps[j]) if j < min(len(a.gaps), len(b.gaps)) else 0.0
            assert gap < bound, f"{how}, case {i}: differs at token {j} where the top-two gap is {gap:.3g}"
            assert b.near_ties + b.shared_near_ties, f"{how}, case {i}: differs without a counted near tie"
            gaps.append(gap)
    # the check saw differences, and the float32 bound would have let some of them pass uncounted
    assert gaps and max(gaps) >= NEAR_TIE, gaps


def test_toolfid_run_in_bfloat16_counts_and_prints_its_near_ties(toolfid_home: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """`toolfid run --dtype bfloat16 --verify --verbose`: the views' records carry the bfloat16 bound, and the near
    ties of the verified view and of the shared prefixes (base view included) are printed above the table. (Without
    ``--verify`` half precision decodes adapter views: tests/test_half_precision.py.)"""
    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cli import main

    paths = fixture_paths()
    out = tmp_path / "bf16"
    # 24 cases (of 72): near ties are many in bfloat16 (measured at 24 cases: 30 verified tokens of faithful, 43
    # shared-prefix tokens of the base; 98 and 148 on all 72)
    assert main(["run", "--base", paths["base"], "--adapter", paths["adapters"]["faithful"], "--cases", "fixture",
                 "--limit", "24", "--dtype", "bfloat16", "--verify", "--no-breakdown", "--verbose",
                 "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tokens of faithful: verified: --verify (metadata verify: true) forces it in bfloat16" in " ".join(text.split())
    results = {v: json.loads((out / v / "results.json").read_text()) for v in ("base", "faithful")}
    records = {v: _generation_record(r, next(iter(r["configs"]))) for v, r in results.items()}
    assert {r["near_tie_tolerance"] for r in records.values()} == {0.25}
    assert records["faithful"]["near_tie_tokens"] > 0 and records["base"]["prefix_near_tie_tokens"] > 0
    flat = " ".join(text.split())
    assert f"faithful {records['faithful']['near_tie_tokens']} token(s)" in flat
    assert "near ties on shared prompt prefixes (top-two logit gap < 0.25" in flat
    assert f"base {records['base']['prefix_near_tie_tokens']} token(s)" in flat
