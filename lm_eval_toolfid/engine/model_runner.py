"""The model as the engine's stages call it: whether it fits the engine (:func:`engine_unsupported`, without
building one), what the engine reads of it (:class:`ModelFit`), and one forward pass with its argmax and top-two
gaps (:class:`ModelRunner`, which counts every pass into the :class:`EngineStats` it is given)."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from lm_eval_toolfid.engine.adapter_store import store_of, stored_names
from lm_eval_toolfid.engine.config import EngineStats
from lm_eval_toolfid.engine.lora_batch import BatchedLora, lora_layers, lora_stack, say_once, stack_unsupported
from lm_eval_toolfid.engine.masks import prepared_mask


BASE_VIEW = "__base__"
"""PEFT's name for "no adapter" in a mixed batch (``adapter_names``): the row gets the base layer's output only."""


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


def mixed_batch_layers(model: Any) -> list[Any]:
    """The modules PEFT hands ``adapter_names`` to in a mixed batch (its LoRA layers and auxiliary training
    wrappers, as ``LoraModel._enable_peft_forward_hooks`` finds them); none for a model without PEFT."""
    try:
        from peft.tuners.lora import LoraLayer
        from peft.utils import AuxiliaryTrainingWrapper
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, (LoraLayer, AuxiliaryTrainingWrapper))]


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
        self._routed = False
        """:meth:`routing` holds hooks on the LoRA layers: a pass hands them its rows' adapters (:attr:`_row_views`)
        instead of PEFT's ``adapter_names=`` argument."""
        self._row_views: list[str] | None = None
        self.lora: BatchedLora | None = None
        """While :meth:`routing` runs the rows' adapters through the stacked LoRA computation
        (:mod:`~lm_eval_toolfid.engine.lora_batch`): a pass names its rows there."""
        if self.device.type == "cpu" and fold_gqa:
            from lm_eval_toolfid.engine.attention import folded_gqa_attention

            self.attention: Callable[[], Any] = folded_gqa_attention
        else:
            self.attention = contextlib.nullcontext

    lora: BatchedLora | None = None
    """The stacked LoRA computation while :meth:`routing` runs one (else None)."""
    run_views: tuple[str | None, ...] = ()
    """A joint run's views while :meth:`routing` runs it: ``view_index`` values index this tuple."""
    _view_stack: Any = None
    """``run_views`` as the stack's adapter indices, ``[views]`` on the device (made once per run)."""

    @property
    def routes_on_device(self) -> bool:
        """Whether a joint pass's adapter routing reads each row's adapter from a device tensor (``view_index``), so
        a captured decode step can hold it: the stacked LoRA computation does. PEFT's mixed batch
        (``adapter_names``) builds index lists on the host on every pass, which a CUDA graph cannot hold: joint runs
        then step eagerly (:mod:`~lm_eval_toolfid.engine.step_graphs`)."""
        return self.lora is not None and self._view_stack is not None

    def view_ids(self, views: Sequence[str | None]) -> Any:
        """A pass's rows' views as ``view_index`` takes them: their indices in :attr:`run_views`, ``[rows]`` on the
        device (made with the pass's other inputs, before :meth:`forward`)."""
        return self.torch.tensor([self.run_views.index(v) for v in views], dtype=self.torch.long).to(self.device)

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
            if self.lora is not None:  # on the device when the pass's inputs carry the rows' views (no host copy)
                on_device = view_index is not None and self._view_stack is not None
                self.lora.select(self._view_stack.index_select(0, view_index) if on_device else views)
            else:
                names = [BASE_VIEW if v is None else v for v in views]
                if self._routed:
                    self._row_views = names
                else:
                    kwargs["adapter_names"] = names
        mask = prepared_mask(self.config, attention_mask, q, padded, self.dtype)
        with self.attention():
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                             use_cache=True, **kwargs)
        logits = out.logits
        if logits.shape[1] > keep:
            logits = logits[:, -keep:]
        return logits.float()

    def view_index(self, views: Sequence[str | None]) -> Any:
        """The rows' adapters as :meth:`forward` may take them on a stacked run: a ``[rows]`` long tensor on the
        device (a caller that keeps it there, moving it with its rows, sends nothing to the device per pass)."""
        if self.lora is None:
            raise RuntimeError("no stacked LoRA computation is installed")
        return self.lora.index(views)

    @contextlib.contextmanager
    def routing(self, views: Iterable[str | None] | None, stack: bool = True) -> Iterator[bool]:
        """While a run lasts, the LoRA computation of its adapter rows; yields whether it is the stacked one.

        ``views``: a joint run's views (None: not a joint run; the rows run on the model as it is). ``stack`` (the
        engine's ``stack_lora``): every adapter of the model in one computation per LoRA layer
        (:mod:`~lm_eval_toolfid.engine.lora_batch`), for a joint run's rows and for a view of one active adapter
        alone, so the two compute alike. Where the stack cannot represent the adapters exactly (said once in the
        log), or ``stack`` is off, a joint run's rows go through PEFT's mixed batch: each LoRA layer gets the rows'
        adapters from a pre-forward hook registered once, where PEFT's ``adapter_names=`` argument does the same per
        pass through ``_enable_peft_forward_hooks`` (two walks over every module and a hook registered and removed on
        every LoRA layer, every pass); the layers receive the same ``adapter_names`` either way. An adapter name no
        LoRA layer has is refused as PEFT refuses it."""
        layers = mixed_batch_layers(self.model) if views is not None else []
        if views is not None and layers:
            known = {name for layer in layers for name in (*getattr(layer, "lora_A", {}),
                                                           *getattr(layer, "lora_embedding_A", {}))}
            unknown = {v for v in views if v is not None} - known - set(stored_names(self.model))
            if unknown:
                raise ValueError(f"Trying to infer with non-existing adapter(s): {', '.join(sorted(unknown))}")
        batched, uniform = self._stacked(views) if stack else (None, None)
        store = store_of(self.model)
        if batched is None and store is not None and store.adapters:  # PEFT computes these rows: it must hold them
            lora = lora_layers(self.model)
            alone = [store.active] if store.active and not any(m.disable_adapters for m in lora) else []
            store.materialize(self.model, [v for v in views if v is not None] if views is not None else alone)
        if batched is not None:
            with batched.installed():
                self.lora = batched
                if views is not None:
                    self.run_views = tuple(views)
                    self._view_stack = batched.index(self.run_views)
                if uniform is not None:  # one adapter's view: every row runs it
                    batched.select(batched.index([uniform]))
                try:
                    yield True
                finally:
                    self.lora, self.run_views, self._view_stack = None, (), None
            return
        handles = [layer.register_forward_pre_hook(self._hand_views, with_kwargs=True) for layer in layers]
        self._routed = bool(handles)
        try:
            yield False
        finally:
            for handle in handles:
                handle.remove()
            self._routed, self._row_views = False, None

    def _stacked(self, views: Iterable[str | None] | None) -> tuple[BatchedLora | None, str | None]:
        """The stacked computation for this run (None where PEFT computes it), and the adapter every row runs when
        the run is one adapter's view."""
        layers = lora_layers(self.model)
        if not layers:
            return None, None
        uniform = None
        if views is None:
            if any(m.disable_adapters for m in layers):  # the base alone: PEFT's forward adds nothing
                return None, None
            store = store_of(self.model)
            active = [store.active] if store is not None and store.active else list(layers[0].active_adapters)
            if len(active) != 1:
                say_once(f"{len(active)} adapters active at once: their rows computed by PEFT's forward")
                return None, None
            uniform = active[0]
        why = stack_unsupported(self.model, layers)
        if why is not None:
            say_once(f"adapter rows computed by PEFT, one adapter at a time: {why}")
            return None, None
        stack = lora_stack(self.model, layers)
        if uniform is not None and uniform not in stack.index:
            return None, None
        return BatchedLora(stack, layers, [uniform] if uniform is not None else views), uniform

    def _hand_views(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs["adapter_names"] = self._row_views
        return args, kwargs

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
