"""`pope`: polar coordinate position embedding (Gopalakrishnan et al. 2025, "Decoupling the 'What' and 'Where'
With Polar Coordinate Positional Embeddings", arXiv 2509.10534).

Each of the d components c of a query or key is a complex number whose magnitude comes from content alone,
mu = softplus(x_c), and whose phase from position alone, t theta_c with theta_c = theta^(-c/d) (d frequencies,
one per component, where RoPE has d/2 per pair); a learned phase bias delta_c per head may shift the keys'.
The logit is the real part of the product of the query with the conjugated key:

    a(t, s) = sum_c softplus(q_c) softplus(k_c) cos((t - s) theta_c + delta_c)

Site: attention. The product equals the plain dot product of q' = [mu_q cos(t theta), mu_q sin(t theta)] and
k' = [mu_k cos(s theta - delta), mu_k sin(s theta - delta)], vectors of 2d dimensions; the q/k site cannot
hold them (the model reshapes its projections to d per head and caches keys of width d), so keys enter the
cache as projected and the attention function builds q' and k' (in fp32) from them and their positions.
Fused backends run q' and k' directly (`transformed`). The paper keeps delta in [-2 pi, 0]; cosines are
2 pi-periodic, so here it is left free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..domains import one_of, option
from .base import AttentionScheme, DerivedBuffers, ModelFacts, OwnParameters, TransformedQK, loaded, register_scheme
from .rope import THETA, native_theta


@dataclass(frozen=True)
class PopeOptions:
    theta: float | None = option(None, "base of the frequencies theta^(-c/d), one per head dimension; default: the "
                                       "model's own rotary base, else 10000", THETA)
    phase_bias: str = option("learned", "'learned': a trainable phase offset per head and component, starting at 0 "
                                        "(Gopalakrishnan et al. 2025); 'none': phases from positions alone",
                             one_of("learned", "none"))


class PolarAttention(TransformedQK, DerivedBuffers, OwnParameters):
    """`forward(query, key, q_pos, k_pos)` -> fp32 PoPE logits; `transformed` -> the (q', k') whose dot product they are."""

    def __init__(self, heads: int, head_dim: int, theta: float, phase_bias: bool) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_derived()
        self.phase = nn.Parameter(torch.empty(heads, head_dim)) if phase_bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The learned phase bias starts at zero: PoPE as published (unless loaded)."""
        if self.phase is not None and not loaded(self.phase):
            self.phase.zero_()

    def derived(self) -> dict[str, torch.Tensor]:
        return {"freqs": (self.theta ** -(torch.arange(self.head_dim, dtype=torch.float64) / self.head_dim)).float()}

    def transformed(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, q, 2d) and (B, H, k, 2d) fp32, from (B, H, q|k, d) query and key (key heads repeated)."""
        q_angle = q_pos.float()[:, None, :, None] * self.freqs
        k_angle = k_pos.float()[:, None, :, None] * self.freqs
        if self.phase is not None:
            k_angle = k_angle - self.phase.float()[None, :, None, :]

        def polar(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
            magnitude = F.softplus(x.float())
            return torch.cat((magnitude * angle.cos(), magnitude * angle.sin()), dim=-1)

        return polar(query, q_angle), polar(key, k_angle)


class Pope(AttentionScheme):
    name = "pope"
    Options = PopeOptions
    citation = "Gopalakrishnan et al. 2025, Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings"

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        return {**options, "theta": float(options["theta"] if options["theta"] is not None else native_theta(facts))}

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        return PolarAttention(facts.num_heads, facts.head_dim, options["theta"], options["phase_bias"] == "learned")


register_scheme(Pope())
