"""``toolfid run`` under a launcher (``torchrun``, ``accelerate launch``): data parallel over the cases.

A launcher starts one process per rank with the standard environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``). Every rank loads the base and the adapters on its own device (``cuda:LOCAL_RANK``,
or the CPU over gloo) and runs every view on its share of the cases — lm-eval's own data-parallel evaluation: each
rank builds its share of the requests, the answers and per-case records are gathered to rank 0, which scores the view.
Rank 0 alone holds the output folder's lock, decides what ``--resume`` reuses (every rank follows its decision),
saves the views and prints the report; the exit code is rank 0's on every rank. A rank that cannot reach the others
ends the run in one line (exit 6) once :data:`TIMEOUT_ENV` seconds pass, not a hang."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, TypeVar

from lm_eval_toolfid.core.errors import EXIT_SERVER, ToolfidError

TIMEOUT_ENV = "TOOLFID_RANK_TIMEOUT"
"""Seconds a rank waits for the others at any collective (default 1800: a view of a large model on a slow rank)."""
T = TypeVar("T")


class RanksUnreachable(ToolfidError):
    """A rank could not reach the others (exit 6)."""

    exit_code = EXIT_SERVER


@dataclass(frozen=True)
class Ranks:
    """This process's place among the launcher's ranks (one rank, 0 of 1, without a launcher)."""

    rank: int = 0
    world: int = 1
    local: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def several(self) -> bool:
        return self.world > 1


def ranks_from_env() -> Ranks:
    """The launcher's ranks from the standard environment; malformed values are one line."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        local = int(os.environ.get("LOCAL_RANK", str(rank)) or 0)
    except ValueError:
        raise ToolfidError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them)") from None
    if world < 1 or not 0 <= rank < world:
        raise ToolfidError(f"RANK {rank} is not a rank of WORLD_SIZE {world}")
    return Ranks(rank, world, local)


def join(ranks: Ranks, cuda: bool) -> None:
    """Join the launcher's process group (NCCL on CUDA devices, gloo on the CPU), with a timeout on every collective;
    a rank that cannot reach the others is :class:`RanksUnreachable`."""
    import torch.distributed as dist

    if not ranks.several or dist.is_initialized():
        return
    seconds = float(os.environ.get(TIMEOUT_ENV, "1800") or 1800)
    if cuda:
        import torch

        torch.cuda.set_device(ranks.local)
    try:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=seconds))
    except Exception as exc:  # noqa: BLE001 - the store or the peers: one line either way
        raise RanksUnreachable(f"rank {ranks.rank} of {ranks.world} could not join the others "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); check "
                               f"MASTER_ADDR/MASTER_PORT and that every rank started") from None


def from_main(ranks: Ranks, compute: Callable[[], T]) -> T:
    """``compute()`` on rank 0, its value (or its one-line error) on every rank."""
    if not ranks.several:
        return compute()
    import torch.distributed as dist

    box: list[Any] = [None]
    if ranks.main:
        try:
            box[0] = ("ok", compute())
        except ToolfidError as exc:
            box[0] = ("error", str(exc), getattr(exc, "exit_code", 4))
    try:
        dist.broadcast_object_list(box, src=0)
    except Exception as exc:  # noqa: BLE001 - a peer gone or too slow: the timeout's one line
        raise RanksUnreachable(f"rank {ranks.rank} lost the other ranks ({type(exc).__name__}); the run stopped "
                               f"(raise {TIMEOUT_ENV} for slow ranks)") from None
    if box[0][0] == "error":
        error = ToolfidError(box[0][1])
        error.exit_code = box[0][2]  # type: ignore[attr-defined]
        raise error
    return box[0][1]


def barrier(ranks: Ranks) -> None:
    """Every rank here before any goes on (a view saved, a reference written)."""
    if ranks.several:
        import torch.distributed as dist

        try:
            dist.barrier()
        except Exception as exc:  # noqa: BLE001
            raise RanksUnreachable(f"rank {ranks.rank} lost the other ranks ({type(exc).__name__}); the run "
                                   f"stopped (raise {TIMEOUT_ENV} for slow ranks)") from None


def leave(ranks: Ranks) -> None:
    """Leave the process group at the end of the run."""
    if ranks.several:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
