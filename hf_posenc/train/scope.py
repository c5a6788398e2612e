"""What a run sets for the whole process, held for the run only: `train()` in a notebook must leave the
caller's process as it found it (deterministic algorithms, cuBLAS's workspace, torch's threads, accelerate's
shared state)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch
from accelerate.state import AcceleratorState

CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"  # what deterministic cuBLAS needs (CUDA docs, "Reproducibility")


def threads(count: int) -> None:
    """`threads`: torch's CPU thread count for the run (0 leaves it)."""
    if count:
        torch.set_num_threads(count)


@contextlib.contextmanager
def run_only() -> Iterator[None]:
    """Restore on exit what the run set process-wide. accelerate keeps one state per process: left behind, a bf16
    run's precision makes the next run of another precision fail with "restart your runtime"; accelerate has no
    public way to end it (its own tests clear it so). A state the caller made before the run is the caller's and
    stays; the process group (PartialState) always stays."""
    before, workspace = torch.are_deterministic_algorithms_enabled(), os.environ.get(CUBLAS_WORKSPACE)
    count = torch.get_num_threads()
    owns_state = not AcceleratorState._shared_state
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
        torch.set_num_threads(count)
        if workspace is None:
            os.environ.pop(CUBLAS_WORKSPACE, None)
        if owns_state:
            AcceleratorState._reset_state()
