"""How many threads torch computes with in `demo` and `eval`: the cores this process may use that other work is
not using now. torch starts one thread per core; on cores shared with other work those threads wait on each
other, and one demo on a loaded 2-core machine took 3,332 CPU-s instead of 815. OMP_NUM_THREADS, when set, wins."""

from __future__ import annotations

import os
import time

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


def limit_threads() -> str:
    """Set torch's thread count to the free cores (unless OMP_NUM_THREADS is set); the status line saying so."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return f"torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS)"
    free, usable = free_cores()
    torch.set_num_threads(free)
    return (f"torch threads: {free} of {usable} cores (the cores idle now; set OMP_NUM_THREADS to choose)")
