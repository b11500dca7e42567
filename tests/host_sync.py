"""Host round trips inside a region of code (a test helper): :class:`HostSyncs`.

On a GPU, a value read back to the host (``.item()``, ``int(t)``, ``bool(t)``: a data-dependent Python branch,
``.tolist()``) waits for every kernel launched before it, and a tensor made from Python values (``torch.tensor(list)``,
indexing with a Python list) is a blocking host-to-device copy: inside a forward pass either one stalls the launch
queue, and a CUDA graph can hold neither. On the CPU neither costs anything, so they go unnoticed there; this mode
sees them on the CPU:

- ``aten::_local_scalar_dense`` (what ``.item()``, ``int()``, ``float()`` and ``bool()`` of a tensor dispatch to;
  under ``inference_mode`` ``bool()`` is ``aten::is_nonzero``), ``aten::equal``;
- ``aten::lift_fresh`` (a tensor made from Python data: ``torch.tensor``, ``as_tensor``, a Python list as an index);
- a copy from a CPU tensor to another device (``_to_copy``/``copy_``: seen when a GPU runs it);
- ``Tensor.tolist`` / ``Tensor.numpy`` (they read the data without dispatching: wrapped while the mode is on).

Each is recorded with the innermost frame outside torch that caused it, so a failure names the line to fix.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
READS = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default}
"""Ops whose answer is a Python value (under ``inference_mode`` ``bool(t)`` dispatches ``is_nonzero`` itself)."""
FROM_PYTHON = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
COPIES = {aten._to_copy.default, aten.copy_.default}


@dataclass(frozen=True)
class Sync:
    what: str
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.what} ({self.op}) at {self.where}"


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("/tests/host_sync.py"):
            return f"{'/'.join(frame.filename.rsplit('/', 2)[-2:])}:{frame.lineno} {frame.name}: {frame.line}"
    return "?"


class HostSyncs(TorchDispatchMode):
    """Records every host round trip while it is on (``with HostSyncs() as syncs: ...``; then ``syncs.found``)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[Sync] = []
        self._saved: list[tuple[str, Any]] = []

    def _record(self, what: str, op: str) -> None:
        self.found.append(Sync(what, op, _caller()))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in READS:
            self._record("a value read back to the host", str(func))
        elif func in FROM_PYTHON:
            self._record("a tensor made from Python values", str(func))
        elif func in COPIES:
            src = args[1] if func is aten.copy_.default else args[0]
            dst = args[0].device if func is aten.copy_.default else kwargs.get("device")
            if isinstance(src, torch.Tensor) and src.device.type == "cpu" and dst is not None \
                    and torch.device(dst).type != "cpu":
                self._record("a host-to-device copy", str(func))
        return func(*args, **kwargs)

    def __enter__(self) -> HostSyncs:
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            self._saved.append((name, original))

            def wrapped(tensor: Any, *a: Any, _original: Any = original, _name: str = name, **k: Any) -> Any:
                self._record("a tensor read into Python", f"Tensor.{_name}")
                return _original(tensor, *a, **k)

            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for name, original in reversed(self._saved):
                setattr(torch.Tensor, name, original)
            self._saved.clear()
