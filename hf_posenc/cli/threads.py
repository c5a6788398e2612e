"""How many threads torch computes with in `demo` and `eval`: the cores this process may use that other work is
not using now. torch starts one thread per core; on cores shared with other work those threads wait on each
other, and one demo on a loaded 2-core machine took 3,332 CPU-s instead of 815. OMP_NUM_THREADS, when set, wins."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from .. import progress

SAMPLE_S = 0.25  # how long the machine's idle time is sampled


def _idle_fraction() -> float | None:
    """The share of the machine's CPU time spent idle over SAMPLE_S (Linux's /proc/stat), or None."""
    def read() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = [int(x) for x in handle.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    try:
        idle0, total0 = read()
        time.sleep(SAMPLE_S)
        idle1, total1 = read()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / (total1 - total0) if total1 > total0 else None


def free_cores() -> tuple[int, int]:
    """(cores free now, cores this process may use): the idle share of the machine now, else 1 - load average."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    machine = os.cpu_count() or usable
    idle = _idle_fraction()
    if idle is None:
        idle = max(0.0, 1.0 - os.getloadavg()[0] / machine) if hasattr(os, "getloadavg") else 1.0
    return max(1, min(usable, round(idle * machine))), usable


@contextlib.contextmanager
def limited_threads(message: str, active: bool = True) -> Iterator[None]:
    """Import torch and transformers under the status line `message` (seconds on a busy machine), then, where
    `active` and OMP_NUM_THREADS is not set, hold torch's thread count to the idle cores for the block (never
    above what it was: a test worker's one thread stays one), and say so."""
    with progress.importing(message):  # the checks may have imported them already
        import torch
        import transformers  # noqa: F401 - its first import is slow too: under the same status line

    before = torch.get_num_threads()
    if active and not os.environ.get("OMP_NUM_THREADS"):
        free, usable = free_cores()
        torch.set_num_threads(min(before, free))
        progress.status(f"torch threads: {torch.get_num_threads()} of {usable} cores (the cores idle now; "
                        "OMP_NUM_THREADS=N chooses)")
    try:
        yield
    finally:
        torch.set_num_threads(before)
