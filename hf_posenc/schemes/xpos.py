"""`xpos`: RoPE with an exponential decay of the logit with distance (Sun et al. 2022, "A
Length-Extrapolatable Transformer", eq. 5-6). Rotation pair i gets zeta_i = (2i/d + gamma)/(1 + gamma);
q at position n is scaled by zeta^((n - c)/B), k at m by zeta^(-(m - c)/B), so q.k carries zeta^((n-m)/B).

The centre c cancels in the product; it only keeps the two factors in range. As in the paper's reference
code (torchscale's XPOS counts positions from -(L // 2)), c is the middle of the window the keys span, so
it moves as a cache grows: keys go into the cache rotated by nothing and unscaled, and this scheme
rotates and scales inside the attention function, in fp32, with the positions the keys were written at.
The decay assumes keys precede queries: causal models only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import option, positive
from .base import AttentionScheme, DerivedBuffers, ModelFacts, TransformedQK, register_scheme
from .rope import PARTIAL, THETA, plain_rotary, resolve_rotation
from .rotary import Rotary, rotate_heads


@dataclass(frozen=True)
class XposOptions:
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "rotating fraction of head dims; default: model's own or 1", PARTIAL)
    gamma: float = option(0.4, "zeta offset (0.4 in Sun et al.)", positive("Sun et al. 2022"))
    scale_base: float = option(512.0, "B: distance over which the decay acts (512 in Sun et al.)", positive())


class XposAttention(TransformedQK, DerivedBuffers):
    """`forward(query, key, q_pos, k_pos)` -> fp32 logits of the rotated, decayed q and k; `transformed`
    gives those q and k themselves, which fused attention paths (`hf_posenc.fast_attention`) run."""

    def __init__(self, rotary: Rotary, gamma: float, scale_base: float) -> None:
        super().__init__()
        self.rotary, self.gamma, self.scale_base = rotary, gamma, scale_base
        self.register_derived()

    def derived(self) -> dict[str, torch.Tensor]:
        half, pairs = self.rotary.head_dim // 2, self.rotary.rotated_pairs
        zeta = torch.ones(half)
        zeta[:pairs] = (torch.arange(0, 2 * pairs, 2) / (2 * pairs) + self.gamma) / (1 + self.gamma)
        return {"zeta": zeta}

    def decay(self, positions: torch.Tensor) -> torch.Tensor:
        """(B, 1, L, D) zeta^(positions / B) over both halves of the rotate-half layout."""
        scale = self.zeta.float() ** (positions.float()[..., None] / self.scale_base)
        return torch.cat((scale, scale), dim=-1)[:, None]

    def transformed(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (q, k) rotated and decayed; positions measured from the middle of the span, so the
        decays stay within fp32 range (only their ratio zeta^(n - m) reaches the logits)."""
        centre = (k_pos.amin(-1, keepdim=True) + q_pos.amax(-1, keepdim=True) + 1) // 2
        q = rotate_heads(query, self.rotary, q_pos) * self.decay(q_pos - centre)
        k = rotate_heads(key, self.rotary, k_pos) * self.decay(centre - k_pos)
        return q.float(), k.float()


class Xpos(AttentionScheme):
    name = "xpos"
    causal_only = True
    Options = XposOptions
    citation = "Sun et al. 2022, A Length-Extrapolatable Transformer (xPos)"
    test_settings = {"xpos": {"scale_base": 16.0}, "xpos-l0": {"scale_base": 16.0, "layers": [0]}}

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        return resolve_rotation(options, facts)

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        rotary = plain_rotary(options, facts)
        return XposAttention(rotary, options["gamma"], options["scale_base"])


register_scheme(Xpos())
