"""Per-row stopping at the end of the tool call, for transformers' generation.

:func:`make_stopping_criteria` wraps :class:`lm_eval_toolfid.formats.call_end.CallScanner` as a
``StoppingCriteria`` that answers per sequence of a batch (lm-eval's own criteria stop a batch
only once *every* row has hit a stop sequence); :class:`IncrementalDecoder` turns token ids into
new text per step without re-decoding the whole sequence.
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
