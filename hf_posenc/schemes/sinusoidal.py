"""`sinusoidal`: the fixed code of Vaswani et al. 2017, computed on the fly (no table, no limit)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..options.input import SinusoidalOptions
from ..registry import register_scheme
from .base import InputScheme, ModelFacts


def sinusoidal_code(positions: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)); fp32, shape (*positions, dim)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.float()[..., None] * inv_freq
    code = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    return code[..., :dim]


class SinusoidalPositions(nn.Module):
    def __init__(self, dim: int, base: float, scale: float, dtype: torch.dtype, offset: int = 0) -> None:
        super().__init__()
        self.dim, self.base, self.scale, self.offset = dim, base, scale, offset
        self.register_buffer("dtype_ref", torch.zeros((), dtype=dtype), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return (sinusoidal_code(position_ids - self.offset, self.dim, self.base) * self.scale).to(self.dtype_ref.dtype)


class Sinusoidal(InputScheme):
    name = "sinusoidal"
    Options = SinusoidalOptions
    citation = "Vaswani et al. 2017, Attention Is All You Need, section 3.5"

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out = dict(options)
        if out["scale"] is None:
            out["scale"] = round(facts.position_rms * 2**0.5, 6)  # the code has RMS 1/sqrt(2) per dim
        return out

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        module = SinusoidalPositions(facts.hidden_size, options["base"], options["scale"], facts.dtype, facts.position_offset)
        return module.to(facts.device)


register_scheme(Sinusoidal())
