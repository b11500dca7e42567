"""The model as the engine's stages call it: whether it fits the engine (:func:`engine_unsupported`, without
building one), what the engine reads of it (:class:`ModelFit`), and one forward pass with its argmax and top-two
gaps (:class:`ModelRunner`, which counts every pass into the :class:`EngineStats` it is given)."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from lm_eval_toolfid.engine.config import EngineStats
from lm_eval_toolfid.engine.lora_batch import BatchedLora
from lm_eval_toolfid.engine.masks import prepared_mask
from lm_eval_toolfid.engine.routing import AdapterRouting


class EngineUnsupported(Exception):
    """The model's cache or forward does not fit this engine (callers fall back to ``generate``)."""


def base_model(model: Any) -> Any:
    """The model under a PEFT wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def text_config(model: Any) -> Any:
    """The decoder's config of ``model`` (of its base model; a multimodal config's text part)."""
    config = base_model(model).config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _forward_params(model: Any) -> Any:
    return inspect.signature(base_model(model).forward).parameters


def _cache_arg(params: Any) -> str:
    # transformers 5.24 renamed forward's past_key_values to cache (the old name deprecated until 5.40)
    return "cache" if "cache" in params else "past_key_values"


def engine_unsupported(model: Any) -> str | None:
    """Why ``model`` does not fit the engine (its forward takes no positions or cache, it has layers other than
    full attention, a sliding window, no layer count), or None when it does. Builds no engine, raises nothing."""
    name = type(base_model(model)).__name__
    try:
        params = _forward_params(model)
        config = text_config(model)
    except (AttributeError, TypeError, ValueError) as exc:
        return f"{name} cannot be inspected ({exc})"
    if "position_ids" not in params or _cache_arg(params) not in params:
        return f"{name}.forward takes no position_ids/past_key_values"
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return f"{name} has {sorted(set(layer_types) - {'full_attention'})} layers"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"{name} uses a sliding window"
    if getattr(config, "num_hidden_layers", None) is None:
        return f"{name}'s config has no num_hidden_layers"
    return None


@dataclass(frozen=True)
class ModelFit:
    """What the engine reads of a model that fits it."""

    cache_arg: str
    """forward's name for the cache (``cache`` or ``past_key_values``)."""
    keep_logits: bool
    """forward takes ``logits_to_keep`` (the lm_head runs only where a token is read)."""
    n_layers: int
    vocab: int

    @staticmethod
    def of(model: Any) -> ModelFit:
        """Raises :class:`EngineUnsupported` (with :func:`engine_unsupported`'s reason) for a model that does
        not fit."""
        why = engine_unsupported(model)
        if why is not None:
            raise EngineUnsupported(why)
        params, config = _forward_params(model), text_config(model)
        return ModelFit(cache_arg=_cache_arg(params), keep_logits="logits_to_keep" in params,
                        n_layers=int(getattr(config, "num_hidden_layers")),
                        vocab=int(getattr(config, "vocab_size", 0) or 0) or 32000)


class ModelRunner:
    """One forward pass of the model (explicit mask, positions and cache; logits of the last ``keep`` columns), and
    the argmax and top-two gap of its logits. Every pass is counted in ``stats``."""

    def __init__(self, model: Any, fit: ModelFit, pad_id: int, stats: EngineStats, fold_gqa: bool) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.fit = fit
        self.pad_id = pad_id
        self.stats = stats
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.config = text_config(model)
        self.adapters = AdapterRouting(model)
        """How each pass's rows reach their adapters (:mod:`~lm_eval_toolfid.engine.routing`)."""
        if self.device.type == "cpu" and fold_gqa:
            from lm_eval_toolfid.engine.attention import folded_gqa_attention

            self.attention: Callable[[], Any] = folded_gqa_attention
        else:
            self.attention = contextlib.nullcontext

    @property
    def lora(self) -> BatchedLora | None:
        """The gathered LoRA computation while :meth:`routing` runs one (else None)."""
        return self.adapters.lora

    @property
    def routes_on_device(self) -> bool:
        """Whether a joint pass's rows are routed from a device tensor of run-view ids (:attr:`AdapterRouting.on_device`:
        a captured decode step can hold it)."""
        return self.adapters.on_device

    def view_ids(self, views: Sequence[str | None]) -> Any:
        """A pass's rows' views as their run-view ids, ``[rows]`` on the device (:meth:`forward`'s ``view_index``)."""
        return self.adapters.run_view_ids(views)

    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any, keep: int,
                step: bool = False, views: Sequence[str | None] | Any = None, *, padded: bool = True,
                tokens: int | None = None, view_index: Any = None) -> Any:
        """Logits of the last ``keep`` positions, [batch, keep, vocab] (float32); ``step``: a decode step (else a
        prompt or draft pass); ``views``: a joint run's pass names each row's adapter (None: the base, PEFT's
        ``__base__``), so one pass serves every view (with the stacked LoRA computation, also as a ``[rows]`` long
        tensor on the device: :meth:`view_index`); without ``views`` every row runs on the model as it is.

        No host round trip between the inputs and the logits (tests/test_host_sync.py counts them): the tensors are
        on the model's device already, and what the host knows it says: ``padded`` (whether any row has a 0 in
        ``attention_mask``: decides the mask the model gets, :func:`~lm_eval_toolfid.engine.masks.prepared_mask`)
        and ``tokens`` (a prompt or draft pass's tokens, padding excluded: the stats). ``view_index``: each row's
        index in the run's views, a device tensor (a decode step's per-slot buffer), for routing that reads it
        (:attr:`routes_on_device`)."""
        stats = self.stats
        stats.forward_passes += 1
        rows, q = int(input_ids.shape[0]), int(input_ids.shape[1])
        if step:
            stats.step_rows.append(rows)
        else:
            stats.prompt_tokens += rows * q if tokens is None else tokens
            stats.padded_tokens += rows * q
        stats.logit_rows += rows * keep
        kwargs: dict[str, Any] = {"logits_to_keep": keep} if self.fit.keep_logits else {}
        kwargs[self.fit.cache_arg] = cache
        if views is not None:
            if len(views) != rows:
                raise ValueError(f"a joint pass of {rows} rows names {len(views)} views")
            kwargs.update(self.adapters.route(views, view_index, step=step))
        mask = prepared_mask(self.config, attention_mask, q, padded, self.dtype)
        with self.attention():
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                             use_cache=True, **kwargs)
        logits = out.logits
        if logits.shape[1] > keep:
            logits = logits[:, -keep:]
        return logits.float()

    def view_index(self, views: Sequence[str | None]) -> Any:
        """The rows' adapters as the gathered computation indexes them (their stack indices, not run-view ids), a
        ``[rows]`` long tensor on the device."""
        return self.adapters.stack_index(views)

    def routing(self, views: Iterable[str | None] | None, stack: bool = True) -> Any:
        """While a run lasts, the LoRA computation of its adapter rows (:meth:`AdapterRouting.run`); yields whether
        it is the gathered one."""
        return self.adapters.run(views, stack)

    def pick(self, logits: Any, with_gaps: bool = True, out: Any = None) -> tuple[list[list[int]], list[list[float]]]:
        """Argmax and (``with_gaps``) top-two gap of every position: ([rows][positions], same). ``out``: a
        ``[rows, positions]`` tensor the argmax is also copied into, on the device (a decode step's next inputs).

        With gaps, one pass (``topk``) gives both: where the top two differ, the top one's index is the argmax; where
        they tie (or are not numbers) ``topk`` may name either, so argmax (the first, as ``generate`` takes it) is
        asked there."""
        with_gaps = with_gaps or self.lora is not None  # adapter rows' near ties are counted
        if not with_gaps:
            best = logits.argmax(dim=-1)  # the same tie-breaking as generate's greedy argmax
            if out is not None:
                out.copy_(best)
            return best.tolist(), []
        top = self.torch.topk(logits, 2, dim=-1)
        if out is not None:
            out.copy_(top.indices[..., 0])
        gaps = (top.values[..., 0] - top.values[..., 1]).tolist()
        best = top.indices[..., 0].tolist()
        for r, row in enumerate(gaps):
            for p, gap in enumerate(row):
                if not gap > 0:  # a tie at the top (or NaN)
                    best[r][p] = first = int(logits[r, p].argmax())
                    if out is not None:
                        out[r, p] = first
        return best, gaps
