"""How a pass's rows reach their adapters (:class:`AdapterRouting`): one way to say a row's adapter, whatever
computes it.

A joint run names its views once (``run_views``: the base, None, and adapter names, in the run's order). A pass then
names each row's view either by name or, on the device, by its **run-view id** (its position in ``run_views``: what a
decode step's per-slot buffer holds, :meth:`AdapterRouting.run_view_ids`). The routing turns that into what computes
the row:

- the gathered LoRA (:mod:`~lm_eval_toolfid.engine.lora_batch`): each row's **stack index** (the adapter's place in the
  model's :class:`~lm_eval_toolfid.engine.lora_batch.LoraStack`, :meth:`AdapterRouting.stack_index`), mapped from
  run-view ids on the device (no host round trip: a captured step can hold it);
- where the stack cannot represent the adapters: PEFT's mixed batch, ``adapter_names``, handed to the LoRA layers by
  pre-forward hooks registered once per run (PEFT's own argument registers and removes a hook on every LoRA layer,
  every pass);
- a view of one adapter (no ``views``): every row runs the active adapter (PEFT's, or the engine store's), through
  the gathered computation where it can.

Adapters the engine's store holds (:mod:`~lm_eval_toolfid.engine.adapter_store`) that reach a PEFT path are loaded into
PEFT first."""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Sequence

from lm_eval_toolfid.engine.adapter_store import store_of, stored_names
from lm_eval_toolfid.engine.lora_batch import BatchedLora, lora_layers, lora_stack, say_once, stack_unsupported

BASE_VIEW = "__base__"
"""PEFT's name for "no adapter" in a mixed batch (``adapter_names``): the row gets the base layer's output only."""


def mixed_batch_layers(model: Any) -> list[Any]:
    """The modules PEFT hands ``adapter_names`` to in a mixed batch (its LoRA layers and auxiliary training
    wrappers, as ``LoraModel._enable_peft_forward_hooks`` finds them); none for a model without PEFT."""
    try:
        from peft.tuners.lora import LoraLayer
        from peft.utils import AuxiliaryTrainingWrapper
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, (LoraLayer, AuxiliaryTrainingWrapper))]


class AdapterRouting:
    """The rows of every pass of one model to their adapters (see the module's docstring)."""

    def __init__(self, model: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.device = next(model.parameters()).device
        self.lora: BatchedLora | None = None
        """The gathered LoRA computation while :meth:`run` runs one (else None)."""
        self.run_views: tuple[str | None, ...] = ()
        """A joint run's views while :meth:`run` runs it: run-view ids index this tuple."""
        self._stack_of_view: Any = None
        """``run_views`` as stack indices, ``[views]`` on the device (made once per run)."""
        self._hooked = False
        """PEFT's mixed batch with hooks: a pass hands the LoRA layers its rows' adapters (:attr:`_row_names`)."""
        self._row_names: list[str] | None = None

    @property
    def on_device(self) -> bool:
        """Whether a joint pass's rows are routed from a device tensor of run-view ids, so a captured decode step can
        hold it: the gathered computation is. PEFT's mixed batch builds index lists on the host on every pass, which
        a CUDA graph cannot hold: joint runs then step eagerly (:mod:`~lm_eval_toolfid.engine.step_graphs`)."""
        return self.lora is not None and self._stack_of_view is not None

    def run_view_ids(self, views: Sequence[str | None]) -> Any:
        """A pass's rows' views as their run-view ids, ``[rows]`` on the device (made with the pass's other inputs)."""
        return self.torch.tensor([self.run_views.index(v) for v in views], dtype=self.torch.long).to(self.device)

    def stack_index(self, views: Sequence[str | None]) -> Any:
        """The rows' adapters as the gathered computation indexes them (their stack indices), ``[rows]`` on the
        device."""
        if self.lora is None:
            raise RuntimeError("no gathered LoRA computation is installed")
        return self.lora.index(views)

    def route(self, views: Sequence[str | None], run_view_ids: Any = None, step: bool = False) -> dict[str, Any]:
        """Name the next pass's rows' adapters (``run_view_ids``: the same on the device, read where the routing
        can); returns the forward's extra keyword arguments (PEFT's ``adapter_names`` where it computes them).
        ``step``: a decode step, which a CUDA graph may capture and replay for other rows: its layers decide per row
        on the device; a prompt or verification pass runs eagerly, and its layers skip what its rows' names say
        they need not compute (:attr:`~lm_eval_toolfid.engine.lora_batch.PassRows.known`)."""
        if self.lora is not None:  # on the device when the pass's inputs carry the rows' views (no host copy)
            on_device = run_view_ids is not None and self._stack_of_view is not None
            if on_device:
                self.lora.select(self._stack_of_view.index_select(0, run_view_ids), host=None if step else views)
            else:
                self.lora.select(views)
            return {}
        names = [BASE_VIEW if v is None else v for v in views]
        if self._hooked:
            self._row_names = names
            return {}
        return {"adapter_names": names}

    @contextlib.contextmanager
    def run(self, views: Iterable[str | None] | None, stack: bool = True) -> Iterator[bool]:
        """While a run lasts, the LoRA computation of its adapter rows; yields whether it is the gathered one.

        ``views``: a joint run's views (None: not a joint run; the rows run on the model as it is). ``stack`` (the
        engine's ``stack_lora``): the gathered computation, for a joint run's rows and for a view of one active
        adapter alone, so the two compute alike. Where it cannot represent the adapters (said once in the log), or
        ``stack`` is off, a joint run's rows go through PEFT's mixed batch. An adapter name nothing holds is refused
        as PEFT refuses it."""
        views = list(views) if views is not None else None
        layers = mixed_batch_layers(self.model) if views is not None else []
        if views is not None and layers:
            known = {name for layer in layers for name in (*getattr(layer, "lora_A", {}),
                                                           *getattr(layer, "lora_embedding_A", {}))}
            unknown = {v for v in views if v is not None} - known - set(stored_names(self.model))
            if unknown:
                raise ValueError(f"Trying to infer with non-existing adapter(s): {', '.join(sorted(unknown))}")
        batched, uniform = self._gathered(views) if stack else (None, None)
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
                    self._stack_of_view = batched.index(self.run_views)
                if uniform is not None:  # one adapter's view: every row runs it, for the whole run (its steps too)
                    batched.select([uniform])
                try:
                    yield True
                finally:
                    self.lora, self.run_views, self._stack_of_view = None, (), None
            return
        handles = [layer.register_forward_pre_hook(self._hand_names, with_kwargs=True) for layer in layers]
        self._hooked = bool(handles)
        try:
            yield False
        finally:
            for handle in handles:
                handle.remove()
            self._hooked, self._row_names = False, None

    def _gathered(self, views: Sequence[str | None] | None) -> tuple[BatchedLora | None, str | None]:
        """The gathered computation for this run (None where PEFT computes it), and the adapter every row runs when
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

    def _hand_names(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs["adapter_names"] = self._row_names
        return args, kwargs
