"""`fope`: Fourier position embedding (Hua et al., ICML 2025, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", arXiv 2412.17739, sec. 4).

RoPE gives each pair m one frequency omega_m = theta^(-2m/d). FoPE makes each a Fourier series over all of
them, with trainable coefficients, and zeroes the frequencies that are under-trained, those whose period
exceeds the training length L (omega < 2 pi / L: they become the series' constant term):

    cos'_m(n) = sum_j C_mj cos(omega_j n),   sin'_m(n) = sum_j S_mj sin(omega_j n)

and q, k rotate by (cos', sin') where RoPE rotates by (cos, sin). C and S start as the identity (each pair's
own frequency, coefficient 1) plus N(0, sigma^2) off the diagonal; sigma = 0 is HoPE's clipping of RoPE.
One series per pair is shared by the heads, and the cross terms make the logit depend on absolute positions
a little (the paper's trade: robustness to spectral damage for exact relativity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import at_least, option
from .base import DerivedBuffers, ModelFacts, OwnParameters, loaded, register_scheme
from .hope import TRAINED
from .rope import PARTIAL, THETA, Rope


@dataclass(frozen=True)
class FopeOptions:
    original_max_position_embeddings: int | None = option(
        None, "training length L: frequencies whose period exceeds it are zeroed; default: the model's own", TRAINED)
    sigma: float = option(0.3, "std of the initial off-diagonal Fourier coefficients (0: RoPE with the clipping)",
                          at_least(0, source="Hua et al. 2025"))
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


class FourierRotary(DerivedBuffers, OwnParameters):
    """`forward(x, position_ids) -> (cos, sin)` over the full head dim, the first `pairs` pairs Fourier series,
    the rest unrotated; the coefficients are the module's weights, the series is computed in fp32."""

    def __init__(self, head_dim: int, pairs: int, theta: float, trained: int, sigma: float) -> None:
        super().__init__()
        self.head_dim, self.pairs, self.theta, self.trained, self.sigma = head_dim, pairs, theta, trained, sigma
        self.register_derived()
        self.cos_coef = nn.Parameter(torch.empty(pairs, pairs))
        self.sin_coef = nn.Parameter(torch.empty(pairs, pairs))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Each coefficient matrix the identity (RoPE) plus N(0, sigma^2) off the diagonal (unless loaded)."""
        eye = torch.eye(self.pairs, device=self.cos_coef.device)
        for coef in (self.cos_coef, self.sin_coef):
            if not loaded(coef):
                coef.copy_(eye + self.sigma * torch.randn_like(eye) * (1 - eye))

    def derived(self) -> dict[str, torch.Tensor]:
        # RoPE's frequencies over the rotating dims, as transformers computes them
        pairs = self.pairs
        freqs = 1.0 / self.theta ** (torch.arange(0, 2 * pairs, 2, dtype=torch.int64).float() / (2 * pairs))
        return {"freqs": torch.where(freqs >= 2 * math.pi / self.trained, freqs, 0.0)}

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        position_ids = position_ids[0] if position_ids.dim() == 3 else position_ids  # multimodal (3, B, L)
        with torch.autocast(position_ids.device.type, enabled=False):
            angles = position_ids.float()[..., None] * self.freqs
            cos = angles.cos() @ self.cos_coef.float().T
            sin = angles.sin() @ self.sin_coef.float().T
        rest = (*position_ids.shape, self.head_dim // 2 - self.freqs.shape[0])
        cos = torch.cat((cos, cos.new_ones(rest)), dim=-1)
        sin = torch.cat((sin, sin.new_zeros(rest)), dim=-1)
        return torch.cat((cos, cos), dim=-1).to(x.dtype), torch.cat((sin, sin), dim=-1).to(x.dtype)


class Fope(Rope):
    name = "fope"
    config_only = False  # trainable series: no rope_parameters
    shift_invariant = False
    Options = FopeOptions
    citation = "Hua et al. 2025, Fourier Position Embedding: Enhancing Attention's Periodic Extension"

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        trained = options["original_max_position_embeddings"] or facts.max_positions
        return {**super().resolve(options, facts), "original_max_position_embeddings": trained}

    def rotary(self, options: dict[str, Any], facts: ModelFacts, max_positions: int) -> nn.Module:
        pairs = int(facts.head_dim * options["partial"]) // 2
        return FourierRotary(facts.head_dim, pairs, options["theta"], options["original_max_position_embeddings"],
                             options["sigma"])


register_scheme(Fope())
