"""Decode steps captured as CUDA graphs and replayed (``EngineConfig.cuda_graphs``; off by default).

On a GPU a decode step of a small model costs what the host takes to launch its kernels (about 1,900 for
SmolLM2-135M), not their arithmetic. A CUDA graph records those launches once and replays them in one call. The
decode step is graph-ready (:meth:`~lm_eval_toolfid.engine.kv_store.DecodeSlots.open_step`): its inputs are device
buffers filled in place before the pass (token ids, positions, the write column :attr:`DecodeSlots.at`, the mask),
the cache is written at that device index, every step of a bucket reads the same columns (all of the buffers'),
and nothing in the forward reads a value back to the host (tests/test_host_sync.py). So one graph per *bucket* of
live rows (:func:`buckets`: 1, 2, 4, ... and the slot count; the live rows padded up to the bucket with free slots,
as vLLM pads its decode batch) serves every step of that bucket, until the buffers are allocated again (their
addresses are the graph's: it is captured again, lazily).

Buckets above ``EngineConfig.max_graph_rows`` are not captured: such a step runs eagerly at its own size. A capture
that fails (an operation the graph cannot hold, memory) is said once in the log, and every step of the run after it
runs eagerly, as without graphs: the same tokens, the run goes on.

A capture runs the step twice eagerly on a side stream (lazy initialisations), then records it; its time and the
graphs' memory pool (shared by every bucket, each captured when a step first needs it) are counted in
:class:`~lm_eval_toolfid.engine.config.EngineStats` (``--verbose`` shows them). The warm-up and capture passes are
not steps: the stats are put back as they were. A replayed step computes exactly what an eager step of the same
shapes computes (tests/test_step_graphs.py compares them on a GPU, token for token); eager steps of the same
shapes (``EngineConfig.graph_shapes``) are compared with the plain ones on the CPU.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable

from lm_eval_toolfid.engine.lora_batch import say_once


def buckets(slots: int) -> tuple[int, ...]:
    """The row counts a step is captured at for buffers of ``slots`` slots: powers of two below it, and it."""
    out, b = [], 1
    while b < slots:
        out.append(b)
        b *= 2
    return (*out, max(1, slots))


def bucket_for(rows: int, slots: int) -> int:
    """The smallest bucket that holds ``rows`` live rows (buffers of ``slots`` slots)."""
    return next(b for b in buckets(slots) if b >= rows)


class StepGraphs:
    """One captured decode step per bucket of rows, for one generation of the decode buffers."""

    def __init__(self, torch: Any, stats: Any, max_rows: int = 512) -> None:
        self.torch, self.stats = torch, stats
        self.graphs: dict[int, tuple[Any, Any]] = {}
        """Bucket -> (the graph, its logits: a static output, overwritten by each replay)."""
        self.generation = -1
        self.pool: Any = None
        self.max_rows = max_rows
        """The largest bucket captured (a step of more rows runs eagerly)."""
        self.failed: str | None = None
        """Why a capture failed (every later step of the run eager), or None."""

    def usable(self, rows: int) -> bool:
        """Whether a step of ``rows`` (its bucket) is replayed from a graph: none failed, and the bucket is capped."""
        return self.failed is None and rows <= self.max_rows

    def run(self, rows: int, generation: int, step: Callable[[], Any]) -> Any:
        """The logits of ``step`` (a decode step of ``rows`` rows, on buffers of ``generation``): replayed, captured
        first if this bucket has no graph for these buffers yet."""
        if generation != self.generation:  # the buffers were allocated again: their graphs read freed memory
            self.graphs.clear()
            self.generation = generation
        if rows not in self.graphs:
            saved = copy.deepcopy(self.stats)
            try:
                self.graphs[rows] = self._capture(step)
            except RuntimeError as exc:  # torch's CUDA errors, out of memory included
                vars(self.stats).update(vars(saved))  # the warm-up passes were not steps
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
                self.failed = f"{type(exc).__name__}: {first}"
                self.graphs.clear()
                say_once(f"--cuda-graphs on: a decode step of {rows} rows could not be captured ({self.failed}); "
                         "the run's other steps run eagerly (the same tokens)")
                return step()
        graph, logits = self.graphs[rows]
        graph.replay()
        self.stats.steps_replayed += 1
        self.stats.step_rows.append(rows)
        self.stats.forward_passes += 1
        self.stats.logit_rows += rows
        return logits

    def _capture(self, step: Callable[[], Any]) -> tuple[Any, Any]:
        torch, stats = self.torch, self.stats
        saved = copy.deepcopy(stats)
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy initialisations (cuBLAS handles, workspaces) happen outside the capture
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = step()
        self.pool = graph.pool()
        torch.cuda.synchronize()
        vars(stats).update(vars(saved))  # the warm-up and capture passes were not steps
        stats.graph_captures += 1
        stats.capture_seconds += time.perf_counter() - t0
        stats.graph_bytes += max(0, torch.cuda.memory_reserved() - before)
        return graph, logits
