"""`learned`: a trainable absolute position table (GPT-2 / BERT style), with explicit init."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..domains import at_least, one_of, option
from .base import EmbeddingDerived, InputScheme, ModelFacts, check_positions, loaded, register_scheme, table_rows
from .sinusoidal import sinusoidal_code


INITS = ("copy", "interpolate", "sinusoidal", "normal", "zeros")


@dataclass(frozen=True)
class LearnedOptions:
    max_positions: int | None = option(None, "table length; default: the model's own max_position_embeddings",
                                       at_least(1, int))
    init: str | None = option(None, "initial table; default: copy the model's table if it has one, else normal",
                              one_of(*INITS))


class LearnedPositions(EmbeddingDerived):
    """`forward(position_ids) -> table[position_ids]`, refusing positions past the table.

    The table keeps the model's `offset` leading rows (RoBERTa's padding rows), so its parameter
    has the stock name and layout and plain transformers reloads it. A model built on the meta device and
    initialised has no table of its own to copy: its init draws the table as `init` draws new rows, scaled by the
    initialised tokens."""

    def __init__(self, table: torch.Tensor, offset: int = 0, init: str = "normal") -> None:
        super().__init__()
        self.weight = nn.Parameter(table)
        self.offset, self.init = offset, init

    @torch.no_grad()
    def rederive_from(self, embeddings: torch.Tensor) -> None:
        if loaded(self.weight):
            return
        init = "normal" if self.init in ("copy", "interpolate") else self.init
        scale = float(embeddings.float().pow(2).mean().sqrt())
        self.weight.copy_(initial_table(init, self.weight.shape[0], self.weight.shape[1], None, self.weight.dtype, scale))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        position_ids = table_rows(position_ids, "learned")
        check_positions(position_ids - self.offset, self.weight.shape[0] - self.offset, "learned")
        return F.embedding(position_ids, self.weight)


def initial_table(init: str, n: int, d: int, old: torch.Tensor | None, dtype: torch.dtype,
                  scale: float) -> torch.Tensor:
    """A (n, d) table. `interpolate` resamples the old table linearly: position interpolation
    (Chen et al. 2023) for learned tables. New entries get the old table's spread, else `scale`."""
    scale = float(old.float().std()) if old is not None else scale
    if init in ("copy", "interpolate") and old is None:
        from ..errors import PosEncError

        raise PosEncError(f"learned init={init!r} needs a model with a learned position table; use one of "
                          "'sinusoidal', 'normal', 'zeros'")
    if init == "copy":
        table = torch.randn(n, d) * scale
        keep = min(n, old.shape[0])
        table[:keep] = old[:keep].float().cpu()
    elif init == "interpolate":
        src = old.float().cpu().T.unsqueeze(0)  # (1, d, n_old)
        table = F.interpolate(src, size=n, mode="linear", align_corners=True)[0].T
    elif init == "sinusoidal":
        table = sinusoidal_code(torch.arange(n), d, 10_000.0) * scale * math.sqrt(2)
    elif init == "normal":
        table = torch.randn(n, d) * scale
    else:
        table = torch.zeros(n, d)
    return table.to(dtype)


class Learned(InputScheme):
    name = "learned"
    Options = LearnedOptions
    citation = "Gehring et al. 2017; Radford et al. 2019 (GPT-2); Devlin et al. 2019 (BERT)"
    reads_weights = True  # the model's own table, copied

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out = dict(options)
        out["max_positions"] = out["max_positions"] or facts.max_positions
        out["init"] = out["init"] or ("copy" if facts.position_table is not None else "normal")
        return out

    def max_positions(self, options: dict[str, Any]) -> int | None:
        return options["max_positions"]

    def fixed_table(self, options: dict[str, Any]) -> bool:
        return True

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        old, offset = facts.position_table, facts.position_offset
        logical = old[offset:] if old is not None else None
        table = initial_table(options["init"], options["max_positions"], facts.hidden_size, logical, facts.dtype,
                              facts.token_rms)
        head = old[:offset].to("cpu", facts.dtype) if old is not None else torch.zeros(offset, facts.hidden_size)
        return LearnedPositions(torch.cat((head.to(facts.dtype), table)), offset, options["init"])


register_scheme(Learned())
