"""Per-row stopping: where one generated row ends (end of the tool call, a stop string, EOS, the budget).

:class:`RowStopper` is what the engine (:func:`lm_eval_toolfid.engine.acceptance.take_token`) asks after every
token of a row: the model's EOS ids (as ``generate`` uses them), lm-eval's ``until`` strings, the end of the
first complete tool call in the text the scorer reads (the prompt's primer + the generation;
:class:`lm_eval_toolfid.formats.call_end.AnswerWatch`, single-call requests only) and ``max_gen_toks``.
:func:`make_stopping_criteria` wraps the same rule as a transformers ``StoppingCriteria`` that answers per sequence of a batch (for ``generate``; lm-eval's
own criteria stop a batch only once *every* row has hit a stop sequence);
:class:`IncrementalDecoder` turns token ids into new text per step without re-decoding the whole
sequence.
"""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_toolfid.formats.call_end import AnswerWatch, answer_settled


class IncrementalDecoder:
    """Token ids -> new text per step without re-decoding the whole sequence (TGI/vLLM-style offsets)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self._decode(tuple(self.ids[self._prefix:self._read]))
        new_text = self._decode(tuple(self.ids[self._prefix:]))
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""

    def _decode(self, ids: tuple[int, ...]) -> str:
        """``ids`` decoded, each short window once per tokenizer (every view of a run decodes the same answers'
        windows again: a hundred B = 0 views, a hundred times)."""
        held = getattr(self.tokenizer, "__dict__", None)
        if held is None:  # a tokenizer without instance attributes: decoded every time
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        cache = held.setdefault("_toolfid_windows", {})
        text = cache.get(ids)
        if text is None:
            if len(cache) >= 65_536:
                cache.clear()
            text = cache[ids] = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text


class RowStopper:
    """The stop rules of one row, fed one generated token at a time.

    ``push`` returns why the row ends with this token (``"eos"``, ``"stop"`` once the scored answer can
    no longer change — an ``until`` string, or the end of the call for a case answered by one call —,
    ``"length"`` for the token budget) or None. The token that triggers a stop is part of the row's
    output, as in ``generate``; lm-eval cuts a stop string off the text itself.

    The rule is :class:`~lm_eval_toolfid.formats.call_end.AnswerWatch` over exactly what the scorer reads:
    ``prefix`` (what the prompt put in front of the answer: plain-v3's primer) + the generated text.
    New text comes from an :class:`IncrementalDecoder` (O(new text) per token); before the row stops, the
    rule is checked once more on the whole decoded text, as lm-eval decodes it. Should the two ever
    disagree (a tokenizer whose pieces do not add up to the whole), the row goes on and from then on is
    checked on its whole text at every token (:attr:`whole_text_checks` counts such rows' tokens).
    """

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int], until: Sequence[str], max_new: int,
                 call_end: bool = False, prefix: str = "") -> None:
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.until = [s for s in until if s]
        self.max_new = max_new
        self.count = 0
        self.call_end = call_end
        self.prefix = prefix
        self.tokenizer = tokenizer
        watching = bool(self.until) or call_end
        self._decoder = IncrementalDecoder(tokenizer) if watching else None
        self._watch = AnswerWatch(self.until, prefix, call_end) if watching else None
        self._whole = False
        self.whole_text_checks = 0

    def push(self, token: int) -> str | None:
        self.count += 1
        if token in self.eos_ids:
            return "eos"
        if self._decoder is not None:
            chunk = self._decoder.push(token)
            if self._whole:
                self.whole_text_checks += 1
                if self._settled_whole():
                    return "stop"
            elif chunk and self._watch.feed(chunk):  # type: ignore[union-attr]
                if self._settled_whole():
                    return "stop"
                self._whole = True
        return "length" if self.count >= self.max_new else None

    def decisions(self, tokens: Sequence[int]) -> list[str | None]:
        """What a fresh stopper of this row's rules answers to each token of ``tokens`` pushed in turn, up to and
        including the one that stops it: the stop rule is a function of the tokens alone, so the rows of a hundred
        views verifying the same draft under the same rules share one walk of it (kept on the tokenizer, as its
        decode windows are) instead of a hundred token-by-token ones. This stopper's own state is not touched."""
        key = (self.eos_ids, tuple(self.until), self.max_new, self.call_end, self.prefix, tuple(tokens))
        held = getattr(self.tokenizer, "__dict__", None)
        cache = held.setdefault("_toolfid_stops", {}) if held is not None else {}
        out = cache.get(key)
        if out is None:
            fresh = RowStopper(self.tokenizer, self.eos_ids, self.until, self.max_new, self.call_end, self.prefix)
            out = []
            for token in tokens:
                out.append(fresh.push(int(token)))
                if out[-1] is not None:
                    break
            if len(cache) >= 16_384:
                cache.clear()
            cache[key] = out
        return out

    def _settled_whole(self) -> bool:
        """The rule on the whole generation, decoded as lm-eval decodes it."""
        text = self.tokenizer.decode(self._decoder.ids, skip_special_tokens=True)  # type: ignore[union-attr]
        return answer_settled(text, self.until, self.prefix, self.call_end)


def make_stopping_criteria(tokenizer: Any, initial_length: int, batch_size: int, stop: Sequence[str] = (),
                           prefixes: Sequence[str] | None = None, call_end: Sequence[bool] | None = None) -> Any:
    """A transformers ``StoppingCriteria`` that stops each row of a batch once its scored answer is settled
    (the same :class:`RowStopper` rule as the engine's: ``prefixes[i]`` in front of row i's text, the end of
    the call where ``call_end[i]`` — default every row)."""
    import torch
    from transformers import StoppingCriteria

    prefixes = list(prefixes) if prefixes is not None else [""] * batch_size
    ends = list(call_end) if call_end is not None else [True] * batch_size

    class CallStoppingCriteria(StoppingCriteria):
        def __init__(self) -> None:
            self.initial_length = initial_length
            self.stoppers = [RowStopper(tokenizer, (), stop, 1 << 30, call_end=ends[i], prefix=prefixes[i])
                             for i in range(batch_size)]
            self.done = torch.zeros(batch_size, dtype=torch.bool)

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            if input_ids.shape[1] <= self.initial_length:
                return self.done.to(input_ids.device)
            last = input_ids[:, -1].tolist()
            for row, token in enumerate(last):
                if not self.done[row] and self.stoppers[row].push(int(token)) is not None:
                    self.done[row] = True
            return self.done.clone().to(input_ids.device)

    return CallStoppingCriteria()


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids ``generate`` stops a row at: the generation config's ``eos_token_id`` (int or list)."""
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
