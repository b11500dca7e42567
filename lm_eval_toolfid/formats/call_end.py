"""Where a tool call ends in a stream of text (the scanner behind early stopping and ``answer_text``).

A small model that has written its call rarely stops by itself: it repeats the call, copies the
schema, or starts another ``### Tools`` block, until the token budget runs out. A stop *sequence*
cannot say "the outermost brace just closed" (braces nest and may sit inside strings), so this
module scans the generated text incrementally:

- ``{...}``: the outermost object closes (string and escape aware) and the span parses as JSON;
  a span that does not parse (``{x}`` in prose) is skipped and the scan goes on;
- ``[...]``: a list at the start of the generation (JSON array of calls, or a pythonic
  ``[f(a=1), g(b="x")]``) closes, brackets/parentheses/braces balanced, ``'`` and ``"`` strings;
- ``<tool_call> ... </tool_call>``: the closing tag; ``[TOOL_CALLS]`` (Mistral) is skipped and
  what follows it scanned;
- a fenced block (```` ```json ... ``` ````): the closing fence;
- any of the task's stop strings (``until``), per sequence.

``CallScanner.feed`` costs O(new text) per step (plus one ``json.loads`` of a span each time an
outermost object closes). ``call_end(text)`` gives the index just past the completion point, so a
generation that ran on can be cut exactly where a stopped one ends: ``truncate_call(full) ==
truncate_call(stopped)`` for greedy decoding, which keeps per-case outcomes identical whether or
not a backend stops early.

A scanner may start from a *prefix* that is not generated: the text a prompt style writes in front of
the answer (plain-v3's primer ``{"name": "``), which the scorer puts back before the generation. The
call structure is scanned over prefix + generation — under a primed prompt the outer ``{`` is in the
prefix, so the first object that closes in the generation is the *arguments* object, not the call —
while stop strings are searched in the generation only (lm-eval cuts them from the generation).

:class:`AnswerWatch` is the stop rule built on it: it says when the scored answer of a growing
generation can no longer change, whatever is generated next (see its docstring for the proof sketch);
:mod:`lm_eval_toolfid.integrations.lm_eval.stopping` asks it after every token of a row.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
FENCE = "```"
MISTRAL = "[TOOL_CALLS]"
_PAIRS = {"{": "}", "[": "]", "(": ")"}
_CLOSERS = set(_PAIRS.values())
_SPECIAL = set("{}[]()\"'")
_IN_DOUBLE = re.compile(r'["\\]')
_IN_SINGLE = re.compile(r"['\\]")
_OBJECT_SPECIAL = re.compile(r'[{}"]')
_LIST_SPECIAL = re.compile(r"""[{}\[\]()"']""")


class CallScanner:
    """Incremental detector of the end of the first complete tool call in a stream of text."""

    def __init__(self, stop: Sequence[str] = (), prefix: str = "") -> None:
        self.text = ""
        self.end: int | None = None  # index of ``text`` (prefix included) just past the completion point
        self.stop = [s for s in stop if s]
        self._max_stop = max((len(s) for s in self.stop), default=0)
        self._pos = 0  # next index of ``text`` to scan
        self._mode = "lead"  # lead | prose | object | list | tag | fence
        self._stack: list[str] = []
        self._quote: str | None = None
        self._escape = False
        self._span_start = 0
        self.generated_from = len(prefix)
        """Where the generation starts in ``text``: stop strings are searched from here on."""
        if prefix:
            self.text = prefix
            self.end = self._scan()

    @property
    def complete(self) -> bool:
        return self.end is not None

    def feed(self, chunk: str) -> bool:
        """Add generated text; True once the call (or a stop string) is complete."""
        if self.end is not None or not chunk:
            return self.end is not None
        start = len(self.text)
        self.text += chunk
        if self.stop:
            self._check_stop(start)
        end = self._scan()
        if end is not None and (self.end is None or end < self.end):
            self.end = end
        return self.end is not None

    def _check_stop(self, start: int) -> None:
        lo = max(self.generated_from, start - self._max_stop + 1)
        for s in self.stop:
            i = self.text.find(s, lo)
            if i != -1 and (self.end is None or i < self.end):
                self.end = i  # the stop string itself is not part of the call

    def _open_span(self, i: int, ch: str, mode: str) -> None:
        self._mode, self._span_start = mode, i
        self._stack = [_PAIRS[ch]]
        self._quote, self._escape = None, False

    def _scan(self) -> int | None:
        text = self.text
        i = self._pos
        n = len(text)
        while i < n:
            mode = self._mode
            ch = text[i]
            if mode == "lead":
                if ch.isspace():
                    i += 1
                    continue
                if ch == "[" and MISTRAL.startswith(text[i:i + len(MISTRAL)]):
                    if len(text) - i < len(MISTRAL):
                        break  # maybe the marker, still arriving
                    i += len(MISTRAL)  # Mistral's marker: the call list follows
                    continue
                if ch in "{[":
                    if ch == "{" and (end := _whole_object_at(text, i)) is not None:
                        self._pos = end
                        return end
                    self._open_span(i, ch, "object" if ch == "{" else "list")
                    i += 1
                    continue
                if ch in "<`":
                    # a tag or fence may still be arriving: wait for enough text to decide
                    marker = OPEN_TAG if ch == "<" else FENCE
                    head = text[i:i + len(marker)]
                    if len(head) < len(marker) and marker.startswith(head):
                        break
                    if head == marker:
                        self._mode = "tag" if ch == "<" else "fence"
                        i += len(marker)
                        self._span_start = i
                        continue
                self._mode = "prose"
                continue
            if mode == "prose":
                j = _first_of(text, i, ("{", OPEN_TAG, FENCE, MISTRAL))
                if j is None:
                    # keep the last few chars in view: a marker may be split across chunks
                    i = max(i, n - len(MISTRAL) + 1)
                    break
                if text.startswith(MISTRAL, j):
                    self._mode, i = "lead", j + len(MISTRAL)
                elif text[j] == "{":
                    if (end := _whole_object_at(text, j)) is not None:
                        self._pos = end
                        return end
                    self._open_span(j, "{", "object")
                    i = j + 1
                elif text.startswith(OPEN_TAG, j):
                    self._mode, i = "tag", j + len(OPEN_TAG)
                    self._span_start = i
                else:
                    self._mode, i = "fence", j + len(FENCE)
                    self._span_start = i
                continue
            if mode == "tag":
                j = text.find(CLOSE_TAG, max(i, self._span_start))
                if j == -1:
                    i = max(i, n - len(CLOSE_TAG) + 1)
                    break
                self._pos = j + len(CLOSE_TAG)
                return self._pos
            if mode == "fence":
                j = text.find(FENCE, max(i, self._span_start))
                if j == -1:
                    i = max(i, n - len(FENCE) + 1)
                    break
                self._pos = j + len(FENCE)
                return self._pos
            # object / list: balanced scan, string and escape aware; a regex jumps over the
            # characters that cannot change the state (most of a call), so a call costs O(n) in C
            quote = self._quote
            if quote is not None:
                if self._escape:
                    self._escape = False
                    i += 1
                    continue
                m = (_IN_DOUBLE if quote == '"' else _IN_SINGLE).search(text, i)
                if m is None:
                    i = n
                    break
                i = m.start()
                if text[i] == "\\":
                    self._escape = True
                else:
                    self._quote = None
                i += 1
                continue
            if ch not in _SPECIAL:
                m = (_OBJECT_SPECIAL if mode == "object" else _LIST_SPECIAL).search(text, i)
                if m is None:
                    i = n
                    break
                i = m.start()
                continue
            if ch == '"' or (ch == "'" and mode == "list"):
                self._quote = ch
            elif ch in _PAIRS and (mode == "list" or ch == "{"):
                self._stack.append(_PAIRS[ch])
            elif ch in _CLOSERS and (mode == "list" or ch == "}"):
                if ch != self._stack[-1]:  # mismatched closer: not a call we can bound
                    self._mode = "prose"
                    i = self._span_start + 1
                    continue
                self._stack.pop()
                if not self._stack:
                    end = i + 1
                    span = text[self._span_start:end]
                    if _is_json_object(span) if mode == "object" else ("(" in span or "{" in span):
                        self._pos = end
                        return end
                    self._mode = "prose"  # ``{x}`` or ``[1]`` in prose: look for the next object
                    i = self._span_start + 1
                    continue
            i += 1
        self._pos = i
        return None


_DECODER = json.JSONDecoder()


def _whole_object_at(text: str, i: int) -> int | None:
    """End of the JSON object starting at ``text[i]`` when all of it is already there (one C-speed
    parse). It is exactly where the balanced scan would close and accept the span; when it is not
    there yet (or the span is not JSON) the scan proceeds as usual."""
    try:
        value, end = _DECODER.raw_decode(text, i)
    except (ValueError, RecursionError):
        return None
    return end if isinstance(value, dict) else None


def _first_of(text: str, start: int, markers: Sequence[str]) -> int | None:
    hits = [j for j in (text.find(m, start) for m in markers) if j != -1]
    return min(hits) if hits else None


def _is_json_object(span: str) -> bool:
    try:
        return isinstance(json.loads(span), dict)
    except (ValueError, RecursionError):
        return False


def call_end(text: str, stop: Sequence[str] = (), prefix: str = "") -> int | None:
    """Index (in ``prefix + text``) just past the first complete call, or the start of a stop string in
    ``text``; None if none yet."""
    scanner = CallScanner(stop, prefix)
    scanner.feed(text)
    return scanner.end


def call_complete(text: str, stop: Sequence[str] = ()) -> bool:
    """True once ``text`` holds a complete tool call (see the module docstring for the shapes)."""
    return call_end(text, stop) is not None


def truncate_call(text: str, stop: Sequence[str] = ()) -> str:
    """``text`` cut just after its first complete call (unchanged when there is none)."""
    end = call_end(text, stop)
    return text if end is None else text[:end]



class AnswerWatch:
    """When the scored answer of a growing generation can no longer change (the stop rule of a row).

    The scorer reads a generation as ``prefix + cut(generation)`` — ``cut``: lm-eval's, at the first of
    its ``until`` strings, applied to the generation only; ``prefix``: what the prompt style put in front
    of the answer — and, for a case answered by (at most) one call (``call_end``), keeps that text up to
    the end of its first complete call (:func:`truncate_call`). :meth:`feed` says True once that answer is
    the same for every continuation of the text fed so far, which holds when no ``until`` string is
    partly written at the end of the text (``...\n#`` of ``\n###``) and either

    - an ``until`` string occurs in the text (every later occurrence comes after it, so the cut is fixed), or
    - ``call_end`` and ``prefix + text`` holds a complete call (any later cut keeps all of the text, and the
      first complete call of a text is the first complete call of every longer text).

    Without a partial stop string at the end, every occurrence in a longer text that starts inside this
    one lies wholly inside it, so lm-eval's sequential cut (each ``until`` in turn) gives the same result,
    or a result at least this long. A partial one makes the row wait for the next token (one token at most
    for ``\n###`` after a call that ends in a newline).
    """

    def __init__(self, until: Sequence[str] = (), prefix: str = "", call_end: bool = False) -> None:
        self.until = [s for s in until if s]
        self._longest = max((len(s) for s in self.until), default=0)
        self.scanner = CallScanner(prefix=prefix) if call_end else None
        self.text = ""
        self.cut = False
        """An ``until`` string occurs in the text."""

    def feed(self, chunk: str) -> bool:
        if chunk:
            start = len(self.text)
            self.text += chunk
            if not self.cut and self.until:
                lo = max(0, start - self._longest + 1)
                self.cut = any(self.text.find(s, lo) != -1 for s in self.until)
            if self.scanner is not None and not self.scanner.complete:
                self.scanner.feed(chunk)
        return self.settled

    @property
    def call_complete(self) -> bool:
        return self.scanner is not None and self.scanner.complete

    @property
    def settled(self) -> bool:
        if not (self.cut or self.call_complete):
            return False
        return not self.pending_stop()

    def pending_stop(self) -> bool:
        """Some ``until`` string is partly written at the end of the text (it may complete next)."""
        text = self.text
        for s in self.until:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    return True
        return False


def answer_settled(text: str, until: Sequence[str] = (), prefix: str = "", call_end: bool = False) -> bool:
    """:class:`AnswerWatch` on a whole text at once."""
    return AnswerWatch(until, prefix, call_end).feed(text)
