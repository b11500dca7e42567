"""A stand-in for a causal LM that does none of a model's arithmetic, for timing the engine's own work.

Each of its layers only appends the step's keys and values (zeros, the real model's heads, head size and dtype) to
the cache the engine hands it, as a real layer does; its logits put the next token at
``(input id * 31 + position * 7 + 1) mod vocabulary`` (a row's tokens depend on its own history only, so any
schedule gives the same tokens). A row stops after a length it is given (:class:`Budget`). What a view through it
costs is then the engine's host work, its KV bookkeeping and the logits' argmax / top-two: what is not model work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Budget:
    """A stop rule that ends a row after ``length`` tokens."""

    def __init__(self, length: int) -> None:
        self.length, self.count = length, 0

    def push(self, token: int) -> str | None:
        self.count += 1
        return "length" if self.count >= self.length else None


def stand_in_model(model_dir: str | Path, dtype: Any, device: Any) -> Any:
    """A stand-in with the layer count, KV heads, head size and vocabulary of the model in ``model_dir``."""
    import torch

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    layers, vocab = int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])

    class Config:
        num_hidden_layers = layers
        vocab_size = vocab
        eos_token_id = None

    class StandIn(torch.nn.Module):
        config = Config()

        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1, dtype=dtype, device=device), requires_grad=False)

        def forward(self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                    past_key_values: Any = None, use_cache: bool = True, logits_to_keep: int = 0) -> Any:
            n, q = input_ids.shape
            kv = torch.zeros((n, heads, q, dim), dtype=self.anchor.dtype, device=input_ids.device)
            for i in range(layers):
                past_key_values.update(kv, kv, i)
            keep = logits_to_keep or q
            token = (input_ids[:, -keep:] * 31 + position_ids[:, -keep:] * 7 + 1) % vocab
            logits = torch.zeros((n, keep, vocab), dtype=self.anchor.dtype, device=input_ids.device)
            logits.scatter_(2, token[..., None], 1.0)

            class Out:
                pass

            out = Out()
            out.logits = logits  # type: ignore[attr-defined]
            return out

    return StandIn().eval()
