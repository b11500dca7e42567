"""What one decode step costs the host: its aten calls (on a GPU each is about a kernel launch, so a step is as slow as
its calls are many) and its host milliseconds, measured on an engine run (:func:`measure_steps`; the benchmarks print
them beside their wall times, and ``tests/test_lora_batch.py`` holds the calls of a step with ten adapters to those
with one)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence


def call_counter() -> Any:
    """A ``TorchDispatchMode`` counting every aten call that reaches a kernel (``calls``, and ``by_name``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CallCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.by_name: dict[str, int] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.calls += 1
            name = str(func.overloadpacket)
            self.by_name[name] = self.by_name.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return CallCounter()


@dataclass
class StepCost:
    """The decode steps of one engine run."""

    calls: list[int] = field(default_factory=list)
    """aten calls of each step (a counting run)."""
    seconds: list[float] = field(default_factory=list)
    """Host seconds of each step (a timing run: the counter off)."""
    by_name: dict[str, int] = field(default_factory=dict)
    """The first step's calls by operator."""

    @property
    def calls_per_step(self) -> int:
        """The median step's calls (the first step of a batch also allocates its KV slots)."""
        return sorted(self.calls)[len(self.calls) // 2] if self.calls else 0

    @property
    def ms_per_step(self) -> float:
        """The median step's host milliseconds."""
        if not self.seconds:
            return 0.0
        ordered = sorted(self.seconds)
        return 1000 * ordered[len(ordered) // 2]


def measure_steps(engine: Any, make_rows: Callable[[], Sequence[Any]], timing: bool = True,
                  count: bool = True) -> StepCost:
    """Run ``engine`` (a :class:`~lm_eval_toolfid.engine.decoding.GreedyEngine`) on ``make_rows()`` once counting
    each decode step's aten calls (``count``), and once more timing each step's host work (``timing``)."""
    cost = StepCost()

    @contextlib.contextmanager
    def counting() -> Iterator[None]:
        with call_counter() as counter:
            yield
        cost.calls.append(counter.calls)
        if len(cost.calls) == 1:
            cost.by_name = dict(counter.by_name)

    @contextlib.contextmanager
    def clock() -> Iterator[None]:
        start = time.perf_counter()
        yield
        cost.seconds.append(time.perf_counter() - start)

    held = engine.step_probe
    try:
        if count:
            engine.step_probe = counting
            engine.run(make_rows())
        if timing:
            engine.step_probe = clock
            engine.run(make_rows())
    finally:
        engine.step_probe = held
    return cost
