"""Per-row stopping: where one generated row ends (end of the tool call, a stop string, EOS, the budget).

:class:`RowStopper` is what :mod:`lm_eval_toolfid.runtime.decoding` asks after every token of a
row: the model's EOS ids (as ``generate`` uses them), lm-eval's ``until`` strings, the end of the
first complete tool call (:class:`lm_eval_toolfid.formats.call_end.CallScanner`, single-call
requests only) and ``max_gen_toks``. :func:`make_stopping_criteria` wraps the same scanner as a
transformers ``StoppingCriteria`` that answers per sequence of a batch (for ``generate``; lm-eval's
own criteria stop a batch only once *every* row has hit a stop sequence);
:class:`IncrementalDecoder` turns token ids into new text per step without re-decoding the whole
sequence.
"""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_toolfid.formats.call_end import CallScanner


class IncrementalDecoder:
    """Token ids -> new text per step without re-decoding the whole sequence (TGI/vLLM-style offsets)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self._prefix:self._read], skip_special_tokens=True)
        new_text = decode(self.ids[self._prefix:], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""


class RowStopper:
    """The stop rules of one row, fed one generated token at a time.

    ``push`` returns why the row ends with this token (``"eos"``, ``"stop"`` for a stop string or
    the end of the call, ``"length"`` for the token budget) or None. The token that triggers a stop
    is part of the row's output, as in ``generate``; lm-eval cuts a stop string off the text itself.
    """

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int], until: Sequence[str], max_new: int,
                 call_end: bool = False) -> None:
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.until = [s for s in until if s]
        self.max_new = max_new
        self.count = 0
        self._decoder = IncrementalDecoder(tokenizer) if (self.until or call_end) else None
        self._scanner = CallScanner(self.until) if call_end else None
        self._text = ""
        self._longest = max((len(s) for s in self.until), default=0)

    def push(self, token: int) -> str | None:
        self.count += 1
        if token in self.eos_ids:
            return "eos"
        if self._decoder is not None:
            chunk = self._decoder.push(token)
            if chunk:
                if self._scanner is not None:
                    if self._scanner.feed(chunk):
                        return "stop"
                else:
                    start = max(0, len(self._text) - self._longest + 1)
                    self._text += chunk
                    if any(s in self._text[start:] for s in self.until):
                        return "stop"
        return "length" if self.count >= self.max_new else None


def make_stopping_criteria(tokenizer: Any, initial_length: int, batch_size: int, stop: Sequence[str] = ()) -> Any:
    """A transformers ``StoppingCriteria`` that stops each row of a batch once its call is complete."""
    import torch
    from transformers import StoppingCriteria

    class CallStoppingCriteria(StoppingCriteria):
        def __init__(self) -> None:
            self.initial_length = initial_length
            self.scanners = [CallScanner(stop) for _ in range(batch_size)]
            self.decoders = [IncrementalDecoder(tokenizer) for _ in range(batch_size)]
            self.done = torch.zeros(batch_size, dtype=torch.bool)

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            if input_ids.shape[1] <= self.initial_length:
                return self.done.to(input_ids.device)
            last = input_ids[:, -1].tolist()
            for row, token in enumerate(last):
                if self.done[row]:
                    continue
                chunk = self.decoders[row].push(int(token))
                if chunk and self.scanners[row].feed(chunk):
                    self.done[row] = True
            return self.done.clone().to(input_ids.device)

    return CallStoppingCriteria()
