"""`lengthgen`: the algorithmic tasks of Kazemnejad et al. (2023) (`evaluation/lengthgen`) on any causal LM, exact
match by input length with n and 95% intervals; `lengthgen:sort,repeat` for some tasks (`copy` and `reverse` are
also the names of the three-shot digit suites, so `lengthgen:copy,reverse` runs `lengthgen:copy` and the `reverse`
suite: write `lengthgen:copy,lengthgen:reverse`). A model trained on a
task (`benchmarks/lengthgen/`, its own tokenizer) is scored with `--lengthgen.shots 0`; a pretrained one is asked in-context
(`--lengthgen.shots 3`: worked examples before each prompt). One table per task."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...domains import at_least, option
from ...errors import PosEncError
from ...results import Plot
from ..suite import Cell, Metric, Scoring, Suite, register_suite

TASKS = ("repeat", "copy", "reverse", "sort")  # `lengthgen.tasks.TASKS`, named here without importing it
PREFIX = "lengthgen "  # the tables: "lengthgen copy", ...
CURVE = Plot("lengthgen.png", "lines", "Length generalisation (Kazemnejad et al. 2023 tasks)",
             "input length (symbols)", "exact match", "exact_match")


@dataclasses.dataclass(frozen=True)
class LengthgenSettings:
    """algorithmic length generalisation (lengthgen)"""

    symbol_lengths: tuple[int, ...] = option((5, 10, 20, 40), "input symbols per lengthgen example, one cell each")
    per_length: int = option(20, "lengthgen examples per input length", at_least(1, int))
    shots: int = option(3, "worked lengthgen examples before each prompt (0 for a model trained on the task)",
                        at_least(0, int))


def _dataset(key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {"dataset_type": "lengthgen", "dataset_name": "Algorithmic tasks of Kazemnejad et al. 2023 (hf-posenc)"}


class Lengthgen(Suite):
    name = "lengthgen"
    help = ("repeat / copy / reverse / sort of Kazemnejad et al. 2023, exact match by input length (lengthgen:sort,"
            "repeat for some; copy and reverse are suites of their own too: write lengthgen:copy,lengthgen:reverse)")
    Settings = LengthgenSettings
    metrics = {f"{PREFIX}{task}": Metric(("exact_match",), "symbols", "exact_match",
                                         task=("text-generation", f"Length generalisation ({task})"),
                                         dataset=_dataset, plot=CURVE) for task in TASKS}
    measured_by = ("symbol_lengths", "per_length", "shots", "seed")
    arguments = "lengthgen tasks"
    order = 45

    def argument(self, names: Sequence[str]) -> str:
        if unknown := [n for n in names if n not in TASKS]:
            raise PosEncError(f"unknown lengthgen task(s) {', '.join(unknown)}; the tasks are {', '.join(TASKS)}")
        chosen = [t for t in TASKS if t in names]
        return "" if chosen == list(TASKS) else ",".join(chosen)

    def check(self, settings: LengthgenSettings, lengths: Sequence[int]) -> None:
        if not settings.symbol_lengths or min(settings.symbol_lengths) < 1:
            raise PosEncError(f"--lengthgen.symbol-lengths must be positive integers, got {list(settings.symbol_lengths)}")

    def cell_sizes(self, settings: LengthgenSettings, argument: str, lengths: Sequence[int]) -> list[tuple[int, int]]:
        """Its own input lengths, not `--lengths`: an example of n symbols is about 2n + 2 words (prompt, answer,
        separator and end) and each shot one more such example; two tokens a word bounds most tokenizers."""
        tasks = argument.split(",") if argument else TASKS
        return [(settings.per_length, 2 * (2 * n + 2) * (settings.shots + 1))
                for _ in tasks for n in settings.symbol_lengths]

    def cells(self, scoring: Scoring, s: LengthgenSettings, argument: str) -> Iterator[Cell]:
        from ..lengthgen import scoring as lengthgen_scoring
        from ..lengthgen.tasks import draw
        from ..lengthgen.vocab import check_tokenizer
        from ..scoring import skipped

        check_tokenizer(scoring.tokenizer)
        for task in argument.split(",") if argument else TASKS:
            for length in s.symbol_lengths:
                shots = draw(task, [length], s.shots, scoring.seed + 1000) if s.shots else []
                prompts = frozenset(e.prompt for e in shots)
                examples = draw(task, [length], s.per_length, scoring.seed, exclude=prompts)
                try:
                    cells = lengthgen_scoring.score(scoring.model, scoring.tokenizer, examples,
                                                    prefix=lengthgen_scoring.shots_prefix(shots),
                                                    batch_size=max(scoring.batch_size, 8), progress=scoring.progress,
                                                    distributed=scoring.distributed)
                except IndexError as err:  # past a learned position table: a skipped cell, as other suites record
                    yield f"{PREFIX}{task}", length, skipped(err)
                    continue
                yield f"{PREFIX}{task}", length, cells[length]


register_suite(Lengthgen())
