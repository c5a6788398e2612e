"""`self_extend`: training-free context extension for RoPE models (Jin et al. 2024, "LLM Maybe LongLM:
Self-Extend LLM Context Window Without Tuning", eq. 3-4).

Within `window` tokens a query sees keys at their true relative positions; beyond it, both sides use
grouped positions floor(p / group), the query's shifted by window - window // group so the two
regimes meet at the window edge. Two rotations of the same q and k are needed, so keys go into the
cache unrotated and this scheme rotates inside the attention function (like the reference code), with
the positions the keys were written at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import at_least, option
from .base import AttentionScheme, ModelFacts, register_scheme
from .rope import PARTIAL, THETA, plain_rotary, resolve_rotation
from .rotary import Rotary, rotate_heads


@dataclass(frozen=True)
class SelfExtendOptions:
    group: int = option(4, "G: positions beyond the window are floor-divided by G (extends context ~G x)",
                        at_least(1, int, "Jin et al. 2024"))
    window: int = option(512, "W: neighbour window kept at exact relative positions", at_least(1, int))
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "rotating fraction of head dims; default: model's own or 1", PARTIAL)


def grouped_positions(q_pos: torch.Tensor, k_pos: torch.Tensor, group: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions beyond the window: floor(p / G), the query's shifted so both regimes meet at W."""
    return q_pos // group + window - window // group, k_pos // group


class SelfExtendAttention(nn.Module):
    """Holds the rotary module; `forward(query, key, q_pos, k_pos)` gives the logits for the attention function, and the
    two rotations and the region test separately for fused paths (`hf_posenc.fast_attention`)."""

    def __init__(self, rotary: Rotary, group: int, window: int) -> None:
        super().__init__()
        self.rotary, self.group, self.window = rotary, group, window

    def rotated(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, H, L, D) rotated to (B, L) positions, fp32."""
        return rotate_heads(x.float(), self.rotary, positions)

    def rotated_pair(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """(q, k) rotated to their true positions, and to their grouped ones (fp32)."""
        q_far, k_far = grouped_positions(q_pos, k_pos, self.group, self.window)
        return ((self.rotated(query, q_pos), self.rotated(key, k_pos)),
                (self.rotated(query, q_far), self.rotated(key, k_far)))

    def near(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Where the true positions apply (elementwise on broadcastable positions)."""
        return q_pos - k_pos < self.window

    def forward(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(B, H, q, k) fp32 q.k logits: exact positions within the window, grouped ones beyond it."""
        (q_near, k_near), (q_far, k_far) = self.rotated_pair(query, key, q_pos, k_pos)
        near = self.near(q_pos[:, None, :, None], k_pos[:, None, None, :])
        return torch.where(near, q_near @ k_near.transpose(-1, -2), q_far @ k_far.transpose(-1, -2))


class SelfExtend(AttentionScheme):
    name = "self_extend"
    causal_only = True
    Options = SelfExtendOptions
    citation = "Jin et al. 2024, LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning"
    test_settings = {"self_extend": {"group": 2, "window": 4}}

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        return resolve_rotation(options, facts)

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        rotary = plain_rotary(options, facts)
        return SelfExtendAttention(rotary, options["group"], options["window"])


register_scheme(SelfExtend())
