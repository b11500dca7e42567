"""One linear pass over a text that finds every balanced ``{...}`` / ``[...]`` span.

The scanner keeps a stack of open brackets. Quotes only matter inside an open bracket (prose
quotes outside JSON are ignored), escapes are honoured, and a raw newline ends a string (JSON
forbids raw newlines in strings, and this stops a stray quote in prose from hiding the rest of
the text). A closer that does not match the innermost opener is treated as prose. Each span
records its *height* (nesting levels inside it, itself included); spans taller than
``MAX_DEPTH`` are never offered for decoding, so ``json.loads`` cannot recurse too deep.

Decoding then goes outermost first: a span that decodes hides the spans inside it; a span that
does not decode (prose in braces) lets its children be tried. ``MAX_DECODES`` and
``DECODE_BUDGET`` bound the work.
"""

from __future__ import annotations

import re
from itertools import compress
from typing import Any, Iterator, NamedTuple

from lm_eval_toolfid.formats.limits import DECODE_BUDGET, MAX_DECODES, MAX_DEPTH, json_error_at, safe_loads

# Possessive quantifiers (Python 3.11+) keep every pattern free of backtracking.
_STR = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"?'
_CLOSED_STR = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_PLAIN_STR = r'"[^"\\\n{}\[\]]*+(?:\\[^{}\[\]\n][^"\\\n{}\[\]]*+)*+"'  # a closed string without brackets
_FLAT = rf'\{{(?:[^{{}}\[\]"]++|{_PLAIN_STR})*+\}}|\[(?:[^{{}}\[\]"]++|{_PLAIN_STR})*+\]'  # no brackets inside
# A token is a run of flat containers (prose between them allowed), a run that opens (openers,
# prose, closed strings), a run that closes (closers, prose, bracket-free strings), or any
# other string. Runs make bombs cheap: one token, not one per bracket; a run of flat containers
# is expanded only if decoding reaches it.
_TOKEN = re.compile(rf'(?P<flat>(?:{_FLAT})(?:[^{{}}\[\]"]*+(?:{_FLAT}))*)'
                    rf'|(?P<open>[{{\[](?:[^}}\]"]++|{_CLOSED_STR})*+)'
                    rf'|(?P<close>[}}\]](?:[^{{\["]++|{_PLAIN_STR})*+)'
                    rf'|(?P<str>{_STR})')
_FLAT_ONE = re.compile(_FLAT)
_CLOSED_STR_RE = re.compile(_CLOSED_STR)


def _blank(m: re.Match[str]) -> str:
    return " " * (m.end() - m.start())


def _outside_strings(tok: str) -> str:
    """``tok`` with every closed string blanked (same length), so brackets in strings vanish."""
    return _CLOSED_STR_RE.sub(_blank, tok) if '"' in tok else tok
RUN = -1  # height recorded for a run of flat containers (each of height 1)
_OPENER = re.compile(r"[{\[]")
_IS_OPENER = frozenset("{[")
_MATCH = {"}": "{", "]": "["}


class Span(NamedTuple):
    start: int
    end: int
    height: int


def _batches(text: str, start: int, end: int, max_depth: int,
             too_deep: list[int] | None = None,
             unclosed: list[int] | None = None) -> Iterator[list[tuple[int, int, int]]]:
    """Balanced spans ``(start, end, height)`` in batches: a batch is yielded each time every
    open bracket has closed (a finished top-level tree), and once more at the end for spans
    under brackets that never close (before that last batch, the position of the outermost
    bracket that never closed is appended to ``unclosed``). Tokens (a whole string, a run of
    openers, a run of closers) come from one ``finditer``; a run of openers is pushed in bulk;
    heights saturate."""
    cap = max_depth + 1
    batch: list[tuple[int, int, int]] = []
    chars: list[str] = []  # the stack of open brackets: their characters,
    where: list[int] = []  # positions,
    child: list[int] = []  # and the tallest span closed inside each so far
    pos: int | None = start
    while pos is not None:
        resume = None
        for m in _TOKEN.finditer(text, pos, end):
            kind = m.lastgroup
            if kind == "flat":
                if chars:
                    batch.append((m.start(), m.end(), RUN))
                    if child[-1] < 1:
                        child[-1] = 1
                else:
                    yield [(m.start(), m.end(), RUN)]
                continue
            tok = m.group()
            if kind == "str":
                if not chars:  # a quote outside any bracket is prose: look inside it for an opener
                    inner = _OPENER.search(tok)
                    if inner is not None:
                        resume = m.start() + inner.start()
                        break
                continue
            at = m.start()
            if kind == "open":
                bare = _outside_strings(tok)
                opened = _OPENER.findall(bare)
                chars.extend(opened)
                if len(opened) == len(tok):
                    where.extend(range(at, at + len(tok)))
                else:
                    where.extend(compress(range(at, at + len(tok)), map(_IS_OPENER.__contains__, bare)))
                child.extend([0] * len(opened))
                continue
            if not chars:
                continue
            for k, ch in enumerate(tok, at):
                if ch != "}" and ch != "]":
                    continue
                if chars[-1] != _MATCH[ch]:
                    continue  # mismatched closer: prose
                chars.pop()
                height = child.pop() + 1
                if height > cap:
                    height = cap
                if height <= max_depth:
                    batch.append((where.pop(), k + 1, height))
                else:
                    where.pop()
                    if too_deep is not None and not too_deep:
                        too_deep.append(k + 1)  # a tree too tall to decode (noted once)
                if not chars:
                    yield batch
                    batch = []
                    break  # the rest of this run holds no opener: nothing to do outside brackets
                if child[-1] < height:
                    child[-1] = height
        pos = resume
    if batch:
        if unclosed is not None and where:
            unclosed.append(where[0])
        yield batch


def spans(text: str, start: int = 0, end: int | None = None, max_depth: int = MAX_DEPTH) -> list[Span]:
    """Every balanced bracket span in ``text[start:end]`` no taller than ``max_depth``, by start."""
    end = len(text) if end is None else min(end, len(text))
    return sorted(span for batch in _batches(text, start, end, max_depth) for entry in batch
                  for span in _expand(text, entry))


def _expand(text: str, entry: tuple[int, int, int]) -> Iterator[Span]:
    if entry[2] != RUN:
        yield Span(*entry)
        return
    for m in _FLAT_ONE.finditer(text, entry[0], entry[1]):
        yield Span(m.start(), m.end(), 1)


def first_span_at(text: str, at: int, end: int | None = None) -> Span | None:
    """The balanced span that opens exactly at ``at`` (scanning stops where it closes), or None
    when it never closes. Callers check ``height`` against ``MAX_DEPTH`` before decoding."""
    end = len(text) if end is None else min(end, len(text))
    if at >= end or text[at] not in "{[":
        return None
    one = _FLAT_ONE.match(text, at, end)
    if one is not None:  # a flat container: done, without matching the run it may start
        return Span(at, one.end(), 1)
    depth = tallest = 0
    for m in _TOKEN.finditer(text, at, end):
        kind = m.lastgroup
        if kind == "flat":  # inside the span (a flat run cannot reach past its closer)
            tallest = max(tallest, depth + 1)
            continue
        if kind == "str":
            continue
        tok = m.group()
        if kind == "open":
            bare = _outside_strings(tok)
            depth += bare.count("{") + bare.count("[")
            tallest = max(tallest, depth)
            continue
        for k, ch in enumerate(tok, m.start()):
            if ch == "}" or ch == "]":
                depth -= 1
                if depth == 0:
                    return Span(at, k + 1, tallest)
    return None


class Decoded(NamedTuple):
    start: int
    end: int
    value: Any
    fragment: bool = False
    """The span lies inside a bracket that does not decode (it never closes, or what it holds is not JSON):
    a piece of a broken outer object (``{"city": "Osaka"}`` of ``{"name": "f", "arguments": {"city": "Osaka"}``),
    not a JSON value written on its own."""


def decoded(text: str, start: int = 0, end: int | None = None, max_decodes: int = MAX_DECODES,
            budget: int = DECODE_BUDGET, too_deep: list[int] | None = None,
            broken: list[tuple[int, int]] | None = None) -> list[Decoded]:
    """Decode spans outermost first, left to right; a decoded span hides the spans inside it.

    Each finished top-level tree is decoded as soon as it closes, so the scan stops as soon as
    ``max_decodes`` candidates or ``budget`` characters have been spent. The end of the
    first span too tall to decode is appended to ``too_deep``. A span inside one that did not
    decode, or under a bracket that never closes, is marked :attr:`Decoded.fragment`; each outermost
    such span (and the bracket that never closes, when spans lie under it) is appended to ``broken`` as
    ``(start, where JSON decoding of it failed)``: what lies before that point parsed as part of it.
    """
    end = len(text) if end is None else min(end, len(text))
    out: list[Decoded] = []
    unclosed: list[int] = []
    for batch in _batches(text, start, end, MAX_DEPTH, too_deep, unclosed):
        under_unclosed = bool(unclosed)  # only the last batch can lie under a bracket that never closes
        if under_unclosed and broken is not None and budget >= end - unclosed[0]:
            budget -= end - unclosed[0]
            broken.append((unclosed[0], unclosed[0] + json_error_at(text[unclosed[0]:end])))
        batch.sort()
        covered_to = failed_to = -1  # spans nest or are disjoint: a later start before failed_to is inside
        for entry in batch:
            if entry[0] < covered_to:
                continue
            for s_start, s_end, _ in _expand(text, entry):
                if max_decodes <= 0 or budget < s_end - s_start:
                    return out
                max_decodes -= 1
                budget -= s_end - s_start
                ok, value = safe_loads(text[s_start:s_end])
                if ok:
                    covered_to = s_end
                    out.append(Decoded(s_start, s_end, value, under_unclosed or s_start < failed_to))
                elif s_end > failed_to:
                    if broken is not None and not under_unclosed and s_start >= failed_to:
                        broken.append((s_start, s_start + json_error_at(text[s_start:s_end])))
                    failed_to = s_end
    return out
