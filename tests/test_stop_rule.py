"""The early stop never changes a scored answer: ``answer(prefix + stopped) == answer(prefix + full)``.

*full* is the generation run on (to the budget, cut at lm-eval's ``until`` as lm-eval cuts it); *stopped*
is where :class:`RowStopper` ends the row; *prefix* is what the prompt wrote of the answer (plain-v3's
primer ``{"name": "``), which the scorer puts back in front. Under a primed prompt the generation's first
closing object is the *arguments* object: a rule fed the generation alone cut ``…"ZA"}}`` one brace short
of the call (issue 28). Here the rule is fed token by token over the same texts cut into tokens every
way (``}}``, ``"}}``, ``}}}``, ``]}`` as one token or several, braces inside strings, escaped quotes),
with and without the primer, for single- and multi-call cases. Real generations: tests/test_stop_real.py.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_eval.models.utils import postprocess_generated_text

from lm_eval_toolfid.formats.call_end import AnswerWatch, CallScanner, answer_settled, call_end
from lm_eval_toolfid.prompts.settings import PRIMER
from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper
from lm_eval_toolfid.scoring.outcome import answer_text

from .conftest import make_case

SINGLE = make_case()
MULTI = make_case(id="c2", gold_calls=[{"name": "get_weather", "arguments": {"city": "A"}},
                                       {"name": "get_time", "arguments": {"tz": "B"}}])
UNTILS = [[], ["\n###"], ["\n###", "<|im_end|>"], ["}\n"]]
MERGED = ['"}}}', "}}}", '"}}', "}}", "]}", '"}', '"]', "\n###", "###"]
"""Pieces a BPE vocabulary often has as one token (SmolLM2 has ``}}``): the tokenizations below use them."""


class PieceTokenizer:
    """Token i decodes to ``pieces[i]``; a sequence decodes to the pieces joined (like a byte-level BPE)."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self._ids: dict[str, int] = {}

    def encode(self, pieces: list[str]) -> list[int]:
        out = []
        for p in pieces:
            if p not in self._ids:
                self._ids[p] = len(self.pieces)
                self.pieces.append(p)
            out.append(self._ids[p])
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


def scored(generation: str, prefix: str, until: list[str], case) -> str:
    """What the scorer reads: lm-eval's cut, the prompt's primer in front, the answer of the case."""
    return answer_text(prefix + postprocess_generated_text(generation, until, None), case)


def stop_index(tok: PieceTokenizer, ids: list[int], prefix: str, until: list[str], single: bool) -> int:
    stopper = RowStopper(tok, (), until, max_new=1 << 30, call_end=single, prefix=prefix)
    for k, token in enumerate(ids, start=1):
        if stopper.push(token) is not None:
            return k
    return len(ids)


def check(pieces: list[str], prefix: str, until: list[str], single: bool = True) -> int:
    tok = PieceTokenizer()
    ids = tok.encode(pieces)
    k = stop_index(tok, ids, prefix, until, single)
    case = SINGLE if single else MULTI
    full = tok.decode(ids)
    stopped = tok.decode(ids[:k])
    assert scored(stopped, prefix, until, case) == scored(full, prefix, until, case), (pieces[:k], pieces[k:])
    return k


def greedy_pieces(text: str, merged: list[str]) -> list[str]:
    """``text`` cut into tokens, the ``merged`` pieces taken whole where they occur (longest first)."""
    pattern = re.compile("|".join(re.escape(m) for m in sorted(merged, key=len, reverse=True)) + "|.", re.S)
    return pattern.findall(text)


CALLS = [
    '{"name": "get_address", "arguments": {"addr": {"city": "Cape Town", "country": "ZA"}}}',
    '{"name": "book", "arguments": {"ids": [1, 2], "opts": {"tags": ["a", "b"]}}}',
    '{"name": "f", "arguments": {"q": "a } b { c", "r": "quote \\" }}} brace"}}',
    '{"name": "f", "arguments": {"nested": {"deep": {"deeper": {"x": 1}}}}}',
    '{"name": "f", "arguments": {"list": [{"a": 1}, {"b": [2]}]}}',
    '{"name": "f", "arguments": {}}',
]
TAILS = ["", "\n###", "\n### Tools\nget_x(a: string)", '\n{"name": "g", "arguments": {}}', "}}}} trailing", "\n"]


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("until", UNTILS)
def test_primed_calls_stop_after_the_call_not_after_its_arguments(call: str, tail: str, until: list[str]) -> None:
    generation = call[len(PRIMER):] + tail
    for pieces in (list(generation), greedy_pieces(generation, MERGED), greedy_pieces(generation, MERGED[:3])):
        k = check(pieces, PRIMER, until)
        if not until or "\n###" in until:  # the whole call is generated before the row stops
            assert "".join(pieces[:k]).startswith(call[len(PRIMER):]) or not tail


@pytest.mark.parametrize("call", CALLS)
def test_every_two_token_split_of_a_primed_call(call: str) -> None:
    """Each boundary of the text (inside ``"}}``, between ``}`` and ``}``…) as the one place it is cut."""
    generation = call[len(PRIMER):] + "\n###"
    for i in range(1, len(generation)):
        for prefix, text in ((PRIMER, generation), ("", call + "\n###")):
            check([text[:i], text[i:]], prefix, ["\n###"])


def test_the_bug_of_issue_28_a_primed_nested_call() -> None:
    """``"}}`` closes the arguments; the call's own ``}`` comes next. The old rule stopped after ``"}}``."""
    tok = PieceTokenizer()
    pieces = ['get', '_address', '",', ' "arguments', '":', ' {"', 'addr', '":', ' {"', 'country', '":', ' "',
              'ZA', '"}}', '}', '\n', '###']
    ids = tok.encode(pieces)
    k = stop_index(tok, ids, PRIMER, ["\n###"], single=True)
    assert "".join(pieces[:k]).endswith('"ZA"}}}')
    # fed the generation alone (no primer), a scanner sees the arguments object close first
    assert call_end("".join(pieces)) == len("".join(pieces[:14]))  # just after '"}}'
    assert call_end("".join(pieces), prefix=PRIMER) == len(PRIMER) + len("".join(pieces[:15]))  # after '}' 


def test_stop_strings_are_searched_in_the_generation_only() -> None:
    scanner = CallScanner(stop=['"'], prefix=PRIMER)  # the primer holds '"': it must not count as a stop
    assert not scanner.complete
    assert not scanner.feed('f')
    assert scanner.feed('", "x') and scanner.end == len(PRIMER) + 1


def test_a_stop_string_written_in_part_holds_the_row() -> None:
    watch = AnswerWatch(["\n###"], PRIMER, call_end=True)
    assert not watch.feed('f", "arguments": {}}\n')  # "\n" may be the start of "\n###": wait one token
    assert watch.feed("#") is False
    assert watch.feed("## Tools")
    assert answer_settled('f", "arguments": {}}\nx', ["\n###"], PRIMER, call_end=True)
    # a stop string after which more text could only come later: settled even without a call
    assert answer_settled("prose\n###", ["\n###"])
    assert not answer_settled("prose\n##", ["\n###"])


def test_a_stop_string_that_could_start_inside_the_call_is_waited_for() -> None:
    """With ``until: ["}\\n"]`` the cut may fall inside the call (``...}\\n`` cuts its last brace off):
    the row goes on until the cut is known."""
    k = check(['f", "arguments": {"a": 1}', "}", "\n", "more"], PRIMER, ["}\n"])
    assert k >= 3


json_leaf = st.none() | st.booleans() | st.integers(-5, 5) | st.text(alphabet='ab{}[]"\\\' \n:,#', max_size=8)
json_values = st.recursive(json_leaf, lambda kids: st.lists(kids, max_size=3) |
                           st.dictionaries(st.text(alphabet='k{}"\\]', max_size=4), kids, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(args=st.dictionaries(st.text(alphabet='ab{}"\\', max_size=5), json_values, max_size=4),
       tail=st.text(alphabet='ab{}[]"\\ \n#<|>', max_size=20),
       cuts=st.lists(st.integers(min_value=1, max_value=6), max_size=60),
       merge=st.booleans(), primed=st.booleans(), single=st.booleans(), until=st.sampled_from(UNTILS))
def test_any_tokenization_any_call_scores_the_same_stopped_or_not(args: dict, tail: str, cuts: list[int],
                                                                   merge: bool, primed: bool, single: bool,
                                                                   until: list[str]) -> None:
    call = json.dumps({"name": "tool", "arguments": args})
    prefix = PRIMER if primed else ""
    text = call[len(prefix):] + tail
    if merge:
        pieces = greedy_pieces(text, MERGED)
    else:
        pieces, pos = [], 0
        for cut in cuts:
            if pos >= len(text):
                break
            pieces.append(text[pos:pos + cut])
            pos += cut
        if pos < len(text):
            pieces.append(text[pos:])
    check(pieces, prefix, until, single)


class SplitDecodingTokenizer(PieceTokenizer):
    """A tokenizer whose pieces do not add up to the whole: piece ``Q`` decodes to ``}`` in a window that starts
    mid-sequence and to nothing in the whole sequence (as lm-eval decodes it)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        whole = bool(ids) and self.pieces[ids[0]] == "START"
        return "".join("" if self.pieces[i] == "START" else (("" if whole else "}") if self.pieces[i] == "Q"
                                                              else self.pieces[i]) for i in ids)


def test_the_row_stops_only_where_the_whole_decoded_text_is_settled() -> None:
    """Incremental text says the call is complete (``Q`` read as ``}``); the whole text, as lm-eval decodes
    it, is not: the row goes on, checked on its whole text, and stops where that is settled."""
    tok = SplitDecodingTokenizer()
    pieces = ["START", '{"name": "f", "arguments": ', '{"a": 1}', "Q", "}", " tail", " more"]
    ids = tok.encode(pieces)
    stopper = RowStopper(tok, (), [], max_new=100, call_end=True)
    reasons = []
    for t in ids:
        reasons.append(stopper.push(t))
        if reasons[-1]:
            break
    assert reasons.index("stop") == pieces.index("}")
    assert tok.decode(ids[:pieces.index("}") + 1]) == '{"name": "f", "arguments": {"a": 1}}'
    assert stopper.whole_text_checks == 1


class _NoSharedWalk:
    """The same stopper without its ``decisions``: every token pushed one by one, as before the shared walk."""

    def __init__(self, stopper: RowStopper) -> None:
        self.stopper = stopper

    def push(self, token: int) -> str | None:
        return self.stopper.push(token)


def _verify_then_decode(stopper, draft: list[int], model: list[int], gaps: list[float], chunks: list[int],
                        max_new: int) -> tuple[list, dict]:
    """A verified row as the engine walks it: its first token from the prompt pass, the draft verified in chunks
    (``model[j]``: the model's pick at position j), then decode steps after a divergence."""
    import dataclasses

    from lm_eval_toolfid.engine.acceptance import accept_predictions, take_token
    from lm_eval_toolfid.engine.handoffs import RowState
    from lm_eval_toolfid.engine.rows import LiveRow, Row, RowResult

    live = LiveRow(0, Row(prompt=[0], stopper=stopper, max_new=max_new, draft=draft), RowResult())
    states = [accept_predictions(live, [(model[0], gaps[0])], verified=False, near_tie=0.5, record=True)]
    k = 0
    while states[-1] is RowState.VERIFY:
        pos = len(live.result.tokens)
        n = chunks[k % len(chunks)]
        k += 1
        states.append(accept_predictions(live, list(zip(model[pos:pos + n], gaps[pos:pos + n])), verified=True,
                                         near_tie=0.5, record=True))
    if states[-1] is RowState.DECODE:
        pos = len(live.result.tokens)
        for token, gap in zip(model[pos:], gaps[pos:]):
            if take_token(live.result, live.row, token, gap, verified=False, near_tie=0.5, record=True):
                states.append("stopped")
                break
    result = dataclasses.asdict(live.result)
    result.pop("deferred")
    return states + [live.pending], result


@settings(max_examples=400, deadline=None)
@given(call=st.sampled_from(CALLS), tail=st.sampled_from(TAILS), until=st.sampled_from(UNTILS),
       primed=st.booleans(), single=st.booleans(), diverge=st.integers(min_value=0, max_value=40),
       chunks=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=4),
       max_new=st.integers(min_value=1, max_value=120), eos_at=st.integers(min_value=-1, max_value=60),
       cut=st.integers(min_value=1, max_value=8),
       gaps=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=120, max_size=120))
def test_verified_tokens_taken_from_the_drafts_shared_walk_are_those_taken_one_by_one(
        call: str, tail: str, until: list[str], primed: bool, single: bool, diverge: int, chunks: list[int],
        max_new: int, eos_at: int, cut: int, gaps: list[float]) -> None:
    """A verified row takes the tokens that match its draft at once, reading where it stops from the draft's walk
    that every view's row of the same case shares: its tokens, counts, near ties, gaps, stop and the state the
    engine goes on in (decode steps after a divergence, its stopper caught up) are those of the token-by-token walk,
    whatever the chunks, the budget, an EOS in the draft or where the model diverges."""
    tok = PieceTokenizer()
    prefix = PRIMER if primed else ""
    text = call[len(prefix):] + tail
    draft = tok.encode([text[i:i + cut] for i in range(0, len(text), cut)])
    eos = tok.encode(["<eos>"])[0]
    if 0 <= eos_at < len(draft) and eos_at % 3 == 0:
        draft = draft[:eos_at] + [eos] + draft[eos_at:]
    other = tok.encode([" "])[0]  # the model's own pick, then the rest of the call: its end needs what came before
    model = (draft[:diverge] + [other] + draft[diverge:] + tok.encode(list(" more text after it, then more")) * 3)[:120]

    def stopper() -> RowStopper:
        return RowStopper(tok, (eos,), until, max_new, call_end=single, prefix=prefix)

    shared = _verify_then_decode(stopper(), draft, model, gaps, chunks, max_new)
    alone = _verify_then_decode(_NoSharedWalk(stopper()), draft, model, gaps, chunks, max_new)
    assert shared == alone
    again = _verify_then_decode(stopper(), draft, model, gaps, chunks, max_new)  # the walk read back, not redone
    assert again == alone and len(tok.__dict__.get("_toolfid_stops", {})) <= 1
