"""The caller's random numbers, untouched: what the self-check draws comes from generators it seeds itself, and
every global random state (torch's CPU and CUDA generators, numpy's, Python's `random`) is put back afterwards, so a
seeded script draws the same LoRA init, shuffles and dropout whether or not a check ran."""

from __future__ import annotations

import contextlib
import random
from typing import Iterator

import numpy as np
import torch


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
