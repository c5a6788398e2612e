"""The study's budget: one tiny decoder, data, optimiser and step count for every arm and task (set by the pilot,
see README.md: `pilot.json`), and the smoke budget the test runs."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Settings:
    tasks: tuple[str, ...] = ("repeat", "copy", "reverse", "sort")
    train_lengths: tuple[int, ...] = tuple(range(1, 21))  # the paper's "train <= 20, test 21-40"
    test_lengths: tuple[int, ...] = tuple(range(21, 41))
    positions: int = 0  # the learned table's rows; 0: the longest test sequence (2 x 40 + 2 tokens)
    layers: int = 2
    width: int = 64
    heads: int = 4
    activation: str = "gelu"  # exact GELU, one kernel: GPT-2's tanh form ("gelu_new") costs a third of a CPU step
    steps: int = 1500  # the pilot (README.md): rope reached 0.945 on copy at 1000 steps, nope 0.73 at 1500 (lengths <= 10)
    # per task, the same for every arm (pilot: repeat 1.00 at 450 steps of 32, sort 0.975 at 1000, reverse 0.98 at 2500)
    task_steps: tuple[tuple[str, int], ...] = (("repeat", 600), ("sort", 1000), ("reverse", 2500))
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    train_examples: int = 20_000  # drawn once per seed, evenly over the train lengths
    iid_per_length: int = 10  # held-out examples per train length: the gate
    test_per_length: int = 25  # per test length
    gate: float = 0.95  # a run counts only at >= 95% exact match in distribution
    seeds: tuple[int, ...] = (0, 1, 2)
    seeds_tier2: tuple[int, ...] = (0,)

    def steps_of(self, task: str) -> int:
        """The optimizer steps every arm trains on `task`."""
        return dict(self.task_steps).get(task, self.steps)

    def longest(self, lengths: tuple[int, ...]) -> int:
        """Tokens of the longest sequence at these lengths: n symbols, `>`, n symbols, `.`."""
        return 2 * max(lengths) + 2

    @property
    def table(self) -> int:
        """The positions a learned table has."""
        return self.positions or self.longest(self.test_lengths)


FULL = Settings()
SMOKE = Settings(tasks=("repeat", "copy"), train_lengths=(1, 2, 3, 4), test_lengths=(5, 6), layers=1, width=32,
                 heads=2, steps=150, task_steps=(), lr=1e-2, batch_size=16, warmup=3, train_examples=400, iid_per_length=4, test_per_length=4,
                 seeds=(0,), seeds_tier2=())
