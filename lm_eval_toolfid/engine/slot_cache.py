"""The KV cache the model writes into: per-layer preallocated ``[rows, heads, capacity, dim]`` buffers, appended in
place (:class:`SlotLayer`: prompt and draft passes; :class:`WindowLayer`: a decode step, written at a device-side
column index), as a transformers :class:`~transformers.cache_utils.Cache` (:class:`SlotCache`).

The classes derive from transformers' own, so they are made on first use (:func:`slot_cache_classes`): importing
the engine imports no torch."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def slot_cache_classes() -> tuple[type, type]:
    """``(SlotLayer, SlotCache)``."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class SlotLayer(DynamicLayer):
        """A layer's keys/values in a ``[batch, heads, capacity, dim]`` buffer; ``length`` columns used."""

        def __init__(self, capacity: int, keys: Any = None, values: Any = None, length: int = 0) -> None:
            super().__init__()
            self.capacity = capacity
            self.length = length
            self.kbuf, self.vbuf = keys, values
            if keys is not None:
                self.dtype, self.device = keys.dtype, keys.device
                self.is_initialized = True
                self.keys, self.values = keys[:, :, :length], values[:, :, :length]

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            b, h, _, d = key_states.shape
            self.dtype, self.device = key_states.dtype, key_states.device
            self.kbuf = key_states.new_zeros(b, h, self.capacity, d)
            self.vbuf = value_states.new_zeros(b, value_states.shape[1], self.capacity, value_states.shape[3])
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:  # only if a caller under-sized it
                self.reserve(max(end, 2 * self.capacity))
            self.kbuf[:, :, self.length:end] = key_states
            self.vbuf[:, :, self.length:end] = value_states
            self.length = end
            self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
            return self.keys, self.values

        def reserve(self, capacity: int) -> None:
            """Make room for ``capacity`` columns (copies only when the buffer is smaller)."""
            if capacity > self.capacity:
                import torch

                grow = capacity - self.capacity
                pad = lambda t: torch.cat([t, t.new_zeros(*t.shape[:2], grow, t.shape[3])], dim=2)  # noqa: E731
                self.kbuf, self.vbuf = pad(self.kbuf), pad(self.vbuf)
                self.capacity = capacity
                self.keys, self.values = self.kbuf[:, :, :self.length], self.vbuf[:, :, :self.length]

        def get_seq_length(self) -> int:
            return self.length

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.length + query_length, 0

        def crop(self, tokens_to_remove: int) -> None:  # pragma: no cover - not used by the engine
            raise NotImplementedError

    class SlotCache(DynamicCache):
        def __init__(self, layers: list[Any]) -> None:
            Cache.__init__(self, layers=layers)

    return SlotLayer, SlotCache


@functools.cache
def window_layer_class() -> type:
    """:class:`WindowLayer`."""
    from transformers.cache_utils import DynamicLayer

    class WindowLayer(DynamicLayer):
        """A decode step's layer over a ``[rows, heads, columns, dim]`` view of the slot buffers: the step's keys and
        values are written at column ``at`` (a one-element device tensor: ``index_copy_``, as transformers'
        ``StaticCache`` writes), and the first ``width`` columns are read (the mask says which of them each row
        attends to). The same layer serves every step whose rows and first column are the same; only ``at`` (on the
        device) and ``width`` change, and a captured step reads every column (``width`` fixed)."""

        def __init__(self, keys: Any, values: Any, at: Any) -> None:
            super().__init__()
            self.kbuf, self.vbuf, self.at = keys, values, at
            self.width = keys.shape[2]
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self.keys, self.values = keys, values

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            self.kbuf.index_copy_(2, self.at, key_states)
            self.vbuf.index_copy_(2, self.at, value_states)
            if self.width == self.kbuf.shape[2]:
                return self.kbuf, self.vbuf
            return self.kbuf[:, :, :self.width], self.vbuf[:, :, :self.width]

        def get_seq_length(self) -> int:
            return self.width - 1

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.width - 1 + query_length, 0

        def crop(self, tokens_to_remove: int) -> None:  # pragma: no cover - not used by the engine
            raise NotImplementedError

    return WindowLayer
