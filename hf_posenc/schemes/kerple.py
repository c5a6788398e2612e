"""`kerple`: a conditionally positive definite kernel, -r1 * log(1 + r2 |i - j|) or -r1 |i - j|^r2
(Chi et al. 2022, KERPLE, sec. 4), shared by all layers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import Relation, one_of, option, positive
from .base import BiasScheme, ModelFacts, OwnParameters, RelativeBias, loaded, register_scheme


@dataclass(frozen=True)
class KerpleOptions:
    variant: str = option("log", "'log': -r1 log(1 + r2 d) or 'power': -r1 d^r2", one_of("log", "power"))
    r1: float = option(1.0, "initial r1 for every head", positive("Chi et al. 2022"))
    r2: float = option(1.0, "initial r2 for every head (power variant: <= 2)", positive("Chi et al. 2022"))

    relations = (Relation("r2", "<=", 2, "power variant needs r2 <= 2 (Chi et al. 2022), got {r2!r}",
                          when=("variant", "power")),)


class KerpleBias(RelativeBias, OwnParameters):
    """Per-head r1, r2 kept positive through a log parametrisation."""

    def __init__(self, heads: int, variant: str, r1: float, r2: float) -> None:
        super().__init__()
        self.heads, self.variant, self.r1, self.r2 = heads, variant, r1, r2
        self.log_r1 = nn.Parameter(torch.empty(heads))
        self.log_r2 = nn.Parameter(torch.empty(heads))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every head's r1 and r2 as the options give them (what loading filled is kept)."""
        for param, value in ((self.log_r1, self.r1), (self.log_r2, self.r2)):
            if not loaded(param):
                param.fill_(math.log(value))

    def by_distance(self, head: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        distance = distance.abs().float()
        r1, r2 = self.log_r1[head].float().exp(), self.log_r2[head].float().exp()
        if self.variant == "log":
            return -r1 * torch.log1p(r2 * distance)
        return -r1 * distance.pow(r2.clamp(max=2.0))


class Kerple(BiasScheme):
    name = "kerple"
    Options = KerpleOptions
    citation = "Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation"

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        return KerpleBias(facts.num_heads, options["variant"], options["r1"], options["r2"])


register_scheme(Kerple())
