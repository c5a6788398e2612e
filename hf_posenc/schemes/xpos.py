"""`xpos`: RoPE with an exponential decay of the logit with distance (Sun et al. 2022, "A
Length-Extrapolatable Transformer", eq. 5-6). Rotation pair i gets zeta_i = (2i/d + gamma)/(1 + gamma);
q at position n is scaled by zeta^(n/B), k at m by zeta^(-m/B), so q.k carries zeta^((n-m)/B).

The scales differ for q and k, which transformers' rotary contract (one cos/sin for both) cannot
express, so xPos always rotates through the q/k taps; keys are scaled before the KV cache.
Decay assumes keys precede queries: causal models only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import check, option
from ..registry import register_scheme
from .base import ModelFacts
from .rope import Rope, Rotary, check_rope_options


@dataclass(frozen=True)
class XposOptions:
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000")
    partial: float | None = option(None, "rotating fraction of head dims in (0, 1]; default: model's own or 1")
    gamma: float = option(0.4, "zeta offset (0.4 in Sun et al.)")
    scale_base: float = option(512.0, "B: distance over which the decay acts (512 in Sun et al.)")

    def __post_init__(self) -> None:
        check_rope_options(self.theta, self.partial)
        check(self.gamma > 0, f"gamma must be > 0, got {self.gamma!r}")
        check(self.scale_base > 0, f"scale_base must be > 0, got {self.scale_base!r}")


class XposRotary(nn.Module):
    def __init__(self, rotary: Rotary, gamma: float, scale_base: float) -> None:
        super().__init__()
        self.rotary, self.scale_base = rotary, scale_base
        half, pairs = rotary.head_dim // 2, rotary.rotated_pairs
        zeta = torch.ones(half)
        zeta[:pairs] = (torch.arange(0, 2 * pairs, 2) / (2 * pairs) + gamma) / (1 + gamma)
        self.register_buffer("zeta", zeta, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cos, sin = self.rotary(x, position_ids)
        scale = self.zeta.float() ** (position_ids.float()[..., None] / self.scale_base)
        return cos, sin, torch.cat((scale, scale), dim=-1).to(x.dtype)


class Xpos(Rope):
    """RoPE's options and rotation, plus the decay."""

    name = "xpos"
    native = False
    causal_only = True
    Options = XposOptions
    citation = "Sun et al. 2022, A Length-Extrapolatable Transformer (xPos)"

    def rotary(self, options: dict[str, Any], facts: ModelFacts, max_positions: int) -> nn.Module:
        return XposRotary(super().rotary(options, facts, max_positions), options["gamma"], options["scale_base"])


register_scheme(Xpos())
