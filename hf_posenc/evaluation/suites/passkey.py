"""`passkey`: passkey retrieval by context length and needle depth (`long_context.passkey`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...domains import at_least, option
from ...errors import PosEncError
from ...results import Plot
from ..suite import Cell, Metric, Scoring, Suite, register_suite


@dataclasses.dataclass(frozen=True)
class PasskeySettings:
    """passkey retrieval"""

    depths: tuple[float, ...] = option((0.0, 0.25, 0.5, 0.75, 1.0), "passkey needle depths in [0, 1]")
    trials: int = option(4, "passkey prompts per length and depth (default 4 x 5 depths = 20 per length)",
                         at_least(1, int))


def _dataset(key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {"dataset_type": "passkey", "dataset_name": "Passkey retrieval (synthetic; prompt of Mohtashami & Jaggi 2023)"}


PASSKEY = Metric(("accuracy",), "tokens", "accuracy", task=("text-generation", "Passkey retrieval"), dataset=_dataset,
                 plot=Plot("passkey.png", "depth_heatmap", "Passkey retrieval", "context length (tokens)",
                           "passkey accuracy", "accuracy", log_x=True))


class Passkey(Suite):
    name = "passkey"
    help = "passkey retrieval by length and depth"
    Settings = PasskeySettings
    metrics = {"passkey": PASSKEY}
    measured_by = ("depths", "trials", "seed")
    order = 20

    def check(self, settings: PasskeySettings, lengths: Sequence[int]) -> None:
        if any(not 0 <= depth <= 1 for depth in settings.depths):
            raise PosEncError(f"--passkey.depths: passkey needle depths in [0, 1], got {list(settings.depths)}")

    def cell_sizes(self, settings: PasskeySettings, argument: str, lengths: Sequence[int]) -> list[tuple[int, int]]:
        return [(settings.trials * len(settings.depths), length) for length in lengths]

    def cells(self, scoring: Scoring, s: PasskeySettings, argument: str) -> Iterator[Cell]:
        from ..long_context import passkey

        for length in scoring.lengths:
            cell = passkey(scoring.model, scoring.tokenizer, [length], s.depths, s.trials, seed=scoring.seed + length,
                           progress=scoring.progress, distributed=scoring.distributed)[length]
            if "by_depth" in cell:
                cell["by_depth"] = {str(d): acc for d, acc in cell["by_depth"].items()}
            yield "passkey", length, cell


register_suite(Passkey())
