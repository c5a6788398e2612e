"""Scoring over the processes of one launch (`accelerate launch`, `torchrun`): join them, split the
items to score, gather every result on every process in the original order.

The split and gather go through `torch.distributed` itself: accelerate's `PartialState()`, asked from
library code, reports one process under a torchrun launch on a CPU-only machine unless it was first
created with `cpu=True` (its `gather_object` then returns this process's share alone, silently).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch
from accelerate import PartialState

Item = TypeVar("Item")
Score = TypeVar("Score")


def join() -> PartialState:
    """This process's place in the launch (one process when not launched), joining its process group.

    On a machine without an accelerator, or with `ACCELERATE_USE_CPU` set (`--accelerate-config cpu_2proc`),
    the processes are CPU processes over gloo: torchrun children do not get `use_cpu` from the config.
    """
    cpu = (torch.accelerator.current_accelerator() is None
           or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true"))
    return PartialState(cpu=cpu)


def rank_and_world(distributed: bool) -> tuple[int, int]:
    """(this process's rank, number of processes) of the torch.distributed group if `distributed`, else (0, 1)."""
    if distributed and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def across_processes(items: Sequence[Item], score: Callable[[list[Item]], list[Score]],
                     distributed: bool) -> list[Score]:
    """`score(items)`, one result per item, with the items split over the processes when `distributed`.

    Every process must call this with the same items; each gets all the results, in order. Each
    process scores one contiguous block, padded to the same size by repeating the last item (whose
    extra results are dropped), so every process runs as many forward passes as the others: FSDP's
    forwards are collective and would hang on an uneven split.
    """
    rank, world = rank_and_world(distributed)
    if world == 1 or not items:
        return score(list(items))
    size = -(-len(items) // world)
    mine = range(rank * size, min((rank + 1) * size, len(items)))
    padded = [items[i] for i in mine] + [items[-1]] * (size - len(mine))
    scored = score(padded)[: len(mine)]
    parts: list[list[Score]] = [[] for _ in range(world)]
    torch.distributed.all_gather_object(parts, scored)
    return [result for part in parts for result in part]


@contextlib.contextmanager
def main_process_first(distributed: bool) -> Iterator[None]:
    """The first process runs the block before the others (which then find what it cached, e.g. a
    dataset built on first use), instead of all of them writing the same files at once. If the block
    fails on the first process, the others still run it (and fail alike) rather than wait forever."""
    rank, world = rank_and_world(distributed)
    if world > 1 and rank != 0:
        torch.distributed.barrier()
    try:
        yield
    finally:
        if world > 1 and rank == 0:
            torch.distributed.barrier()
