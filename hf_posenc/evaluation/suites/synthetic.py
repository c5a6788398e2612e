"""`copy`, `reverse`, `addition`: length generalisation of a causal LM on synthetic tasks (Kazemnejad et al. 2023),
three-shot, exact match by task length (`tasks.length_generalization`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...domains import at_least, option
from ...results import Plot
from ..suite import Cell, Metric, Scoring, Suite, register_suite
from ...stats import rate_fields

TASKS = ("copy", "reverse", "addition")  # `hf_posenc.data.SYNTHETIC_TASKS`, named here without importing datasets
# one figure for every length-generalisation table (the encoder-decoder suites' too)
LENGTH_GENERALIZATION = Plot("length_generalization.png", "lines", "Length generalisation", "task length (digits)",
                             "exact match", "exact_match")


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """length generalisation on synthetic tasks"""

    task_lengths: tuple[int, ...] = option((2, 4, 8, 16), "digits per example for copy/reverse/addition and their "
                                                          "seq2seq_ suites")
    examples: int = option(20, "examples per task length (copy/reverse/addition and their seq2seq_ suites)",
                           at_least(1, int))


@dataclasses.dataclass(frozen=True)
class SyntheticData:
    """A synthetic task's model-index dataset (a value, so tables that share it compare equal)."""

    table: str

    def __call__(self, key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"dataset_type": f"synthetic-{self.table}", "dataset_name": f"Synthetic {self.table} task (hf-posenc)"}


def exact_match(scored: dict[str, Any], n: int) -> dict[str, Any]:
    """A synthetic task's cell: exact match over `n` examples with its 95% Wilson interval."""
    return {"exact_match": scored["exact_match"], **rate_fields(round(scored["exact_match"] * n), n)}


class Synthetic(Suite):
    Settings = TaskSettings
    group = "synthetic"
    measured_by = ("examples", "seed")
    order = 40

    def __init__(self, task: str) -> None:
        self.name = self.task = task
        self.help = f"{task}, three-shot, exact match by task length"
        self.metrics = {task: Metric(("exact_match",), "digits", "exact_match", task=("text-generation",
                                     "Length generalisation"), dataset=SyntheticData(task), plot=LENGTH_GENERALIZATION)}

    def cell_sizes(self, settings: TaskSettings, argument: str, lengths: Sequence[int]) -> list[tuple[int, int]]:
        """Its own task lengths: three shots and the prompt, each about twice its digits plus a few words."""
        return [(settings.examples, 4 * (2 * length + 8)) for length in settings.task_lengths]

    def cells(self, scoring: Scoring, s: TaskSettings, argument: str) -> Iterator[Cell]:
        from ... import data
        from ..scoring import check_lengths
        from ..tasks import length_generalization

        for length in check_lengths(list(s.task_lengths), "task length"):
            shots = data.synthetic_task(self.task, length, 3, seed=scoring.seed + 1000)
            prefix = "".join(f"{p}{t}\n" for p, t in zip(shots["prompt"], shots["target"]))
            examples = data.synthetic_task(self.task, length, s.examples, scoring.seed)
            scored = length_generalization(scoring.model, scoring.tokenizer, examples, prefix=prefix,
                                           batch_size=max(scoring.batch_size, 8), progress=scoring.progress,
                                           distributed=scoring.distributed)
            yield self.task, length, exact_match(scored, len(examples))


for _task in TASKS:
    register_suite(Synthetic(_task))
