"""Training's held-out scores as a suite's tables: what `hf-posenc train` scores on the data it held out (one table
per recipe `task`), described in the run's results.json by a section like every eval suite's, so `compare`, `card`
and the plots read a trained run as they read an evaluation. Training computes the cells (`train.tasks`); this
module says what its tables are called and how they read. It is no `eval` suite: only a training run has its data."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import results
from . import sections
from .suite import Metric, Suite
from .suites.perplexity import PERPLEXITY
from .suites.sentiment import CLASSIFICATION

NAME = "held_out"
# the recipe's settings the tables depend on or name their dataset by
SETTINGS = ("task", "dataset_name", "dataset_config", "dataset_test_split", "seq_len", "max_eval_samples",
            "eval_max_windows", "perplexity_lengths", "dtype")


def _dataset(key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The held-out part of the recipe's data; a local file or folder named by its basename only (a public card)."""
    name = str(settings.get("dataset_name", "?"))
    name = Path(name).name if os.path.exists(name) else name
    return {"dataset_type": name, "dataset_name": f"{name} (held out from training)",
            "dataset_config": settings.get("dataset_config"), "dataset_split": settings.get("dataset_test_split")}


def _answers(task: tuple[str, str]) -> Metric:
    return Metric(("exact_match", "loss"), "dataset", "exact_match", task=task, dataset=_dataset,
                  lower_is_better=("loss",))


# recipe `task` -> (its table, how the table reads)
TABLES: dict[str, tuple[str, Metric]] = {
    "causal_lm": ("perplexity", Metric(PERPLEXITY.fields, PERPLEXITY.key, task=PERPLEXITY.task, dataset=_dataset,
                                       plot=PERPLEXITY.plot, lower_is_better=PERPLEXITY.lower_is_better)),
    "classification": ("classification", Metric(CLASSIFICATION.fields, CLASSIFICATION.key, CLASSIFICATION.rate,
                                                task=CLASSIFICATION.task, dataset=_dataset)),
    "seq2seq": ("seq2seq", _answers(("text2text-generation", "Sequence to sequence"))),
    "prompt_completion": ("completion", _answers(("text-generation", "Prompt completion"))),
}


def table(task: str) -> str:
    """The table a recipe `task` writes its held-out scores to."""
    return TABLES[task][0]


def curve_point(step: int, tokens: int, wall: float, cpu: float, tables: Mapping[str, Any],
                seq_len: int) -> dict[str, Any] | None:
    """One row of a training run's `details.curve` (the recovery curve): the held-out perplexity at every scored
    length at this step, or None when the tables hold no perplexity at the training length (other tasks)."""
    cells = tables.get(table("causal_lm"), {})
    if str(seq_len) not in cells:
        return None
    return {"step": step, "tokens": tokens, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "loss": cells[str(seq_len)]["loss"], "perplexity": {key: cell["perplexity"] for key, cell in cells.items()}}


def perplexity_by_length(tables: Mapping[str, Any]) -> dict[str, float]:
    """Held-out perplexity by length of one run's tables ({} when it has none): the recovery curve's lines."""
    return {key: cell["perplexity"] for key, cell in tables.get(table("causal_lm"), {}).items() if "perplexity" in cell}


class HeldOut(Suite):
    """The tables of one recipe `task`; measured on held-out blocks of the training data."""

    name = NAME
    help = "held-out scores of a training run (hf-posenc train)"

    def __init__(self, task: str) -> None:
        name, metric = TABLES[task]
        self.metrics = {name: metric}

    def measured(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"method": "held-out blocks of the training data", "text": settings.get("dataset_name"),
                "max_windows": settings.get("eval_max_windows")}

    def hub_datasets(self, settings: Mapping[str, Any]) -> list[str]:
        return [settings["dataset_name"]] if isinstance(settings.get("dataset_name"), str) else []


def section(record: results.Results) -> results.Section:
    """The section of a training run's results (its `settings` the flat recipe), datasets named for every key its
    runs hold; `train` gives it to results.json, and formats 2 and 3 are read with it."""
    settings = {key: record.settings[key] for key in SETTINGS if key in record.settings}
    suite = HeldOut(settings.get("task", "causal_lm"))
    described = sections.section(suite, settings)
    for run in record.runs:
        for name in set(run.metrics) & set(described.tables):
            for key in run.metrics[name]:
                sections.wrote(described, suite, name, key)
    return described
