"""`ruler`: RULER's synthetic tasks (Hsieh et al. 2024) through lm-eval's generators and scorer, offline
(`hf_posenc.evaluation.ruler`); `ruler:<task>,<task>` runs some of them. One table per task."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...domains import at_least, option
from ...errors import PosEncError
from ...results import Plot
from ..names import HAYSTACK, MAX_SAMPLES, RULER_TASKS, parse_tasks
from ..suite import Cell, Metric, Scoring, Suite, register_suite

PREFIX = "ruler "  # the tables: "ruler niah_single_1", ...


@dataclasses.dataclass(frozen=True)
class RulerSettings:
    """RULER"""

    samples: int = option(20, "RULER prompts per task and length", at_least(1, int))
    gen_tokens: int | None = option(None, "RULER: cap the greedy answer at N tokens (default: each task's own, "
                                          "30-128)", at_least(1, int))


def _dataset(key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {"dataset_type": "ruler", "dataset_name": "RULER synthetic tasks (Hsieh et al. 2024, lm-eval's generators; "
                                                     "essay haystack: the KJV)"}


HEATMAP = Plot("ruler.png", "heatmap", "RULER score", "context length (tokens)", "score", "score")


class Ruler(Suite):
    name = "ruler"
    help = "RULER's offline tasks (ruler:niah_single_1,vt,... for some)"
    Settings = RulerSettings
    metrics = {f"{PREFIX}{task}": Metric(("score",), "tokens", "score", task=("text-generation", f"RULER {task}"),
                                         dataset=_dataset, plot=HEATMAP) for task in RULER_TASKS}
    measured_by = ("samples", "gen_tokens", "seed", "haystack")
    one_process = "lm-eval's generate loop"
    arguments = "RULER tasks"
    order = 50

    def argument(self, names: Sequence[str]) -> str:
        chosen = parse_tasks(names)
        return "" if chosen == list(RULER_TASKS) else ",".join(chosen)

    def check(self, settings: RulerSettings, lengths: Sequence[int]) -> None:
        if settings.samples > MAX_SAMPLES:
            raise PosEncError(f"--ruler.samples: RULER makes {MAX_SAMPLES} prompts per task and length, got {settings.samples}")

    def recorded(self, settings: RulerSettings, argument: str) -> dict[str, Any]:
        return {**super().recorded(settings, argument), "haystack": HAYSTACK}

    def cell_sizes(self, settings: RulerSettings, argument: str, lengths: Sequence[int]) -> list[tuple[int, int]]:
        return [(settings.samples, length) for _ in parse_tasks(argument.split(",")) for length in lengths]

    def cells(self, scoring: Scoring, s: RulerSettings, argument: str) -> Iterator[Cell]:
        from ..ruler import ruler_scores

        for task in parse_tasks(argument.split(",")):
            for length in scoring.lengths:
                scores = ruler_scores(scoring.model, scoring.tokenizer, [task], [length], s.samples, seed=scoring.seed,
                                      gen_tokens=s.gen_tokens)
                yield f"{PREFIX}{task}", length, scores[task][length]


def ruler_tasks(suites: Sequence[str]) -> list[str]:
    """The RULER tasks a parsed suite list runs (none if it has no ruler suite)."""
    return next((parse_tasks(s.removeprefix("ruler").removeprefix(":").split(",")) for s in suites
                 if s.partition(":")[0] == "ruler"), [])


register_suite(Ruler())
