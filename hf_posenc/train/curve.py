"""The recovery curve's clock: the wall and CPU seconds spent training (evaluation and checkpoints not counted),
against which held-out perplexity is kept every `eval_every_steps` optimizer steps (a row each:
`evaluation.held_out.curve_point`)."""

from __future__ import annotations

import time
from typing import Callable

import torch


class Clock:
    """Training time of this session, on top of what earlier sessions (a resumed run) spent.

    Wall seconds are the main process's; CPU seconds are `time.process_time()` summed over processes,
    so two processes sharing the same cores cost what one would. `pause`/`resume` leave out evaluation
    and checkpoint writes.
    """

    def __init__(self, wall: float = 0.0, cpu: float = 0.0) -> None:
        self.base_wall, self.base_cpu = wall, cpu
        self.wall = self.cpu = 0.0  # this session, this process
        self._tick: tuple[float, float] | None = None
        self.resume()

    def resume(self) -> None:
        self._tick = (time.perf_counter(), time.process_time())

    def pause(self) -> None:
        if self._tick is not None:
            self.wall += time.perf_counter() - self._tick[0]
            self.cpu += time.process_time() - self._tick[1]
            self._tick = None

    def elapsed(self) -> float:
        """Wall seconds of training so far over every session, on this process (no collective), running on."""
        running = time.perf_counter() - self._tick[0] if self._tick is not None else 0.0
        return self.base_wall + self.wall + running

    def totals(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, float]:
        """(wall, cpu) seconds so far over every session; `reduce` sums a tensor over processes (collective).
        Leaves the clock paused: `resume` when training goes on. `reduce` gets fp32, which any device holds
        (MPS has no float64)."""
        self.pause()
        cpu = float(reduce(torch.tensor([self.cpu], dtype=torch.float32)).item())
        return self.base_wall + self.wall, self.base_cpu + cpu
