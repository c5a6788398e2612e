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

from ..config import check, option
from ..registry import register_scheme
from .base import AttentionScheme, ModelFacts
from .rope import Rotary, check_rope_options, plain_rotary, resolve_rotation, rotate_heads


@dataclass(frozen=True)
class SelfExtendOptions:
    group: int = option(4, "G: positions beyond the window are floor-divided by G (extends context ~G x)")
    window: int = option(512, "W: neighbour window kept at exact relative positions")
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000")
    partial: float | None = option(None, "rotating fraction of head dims in (0, 1]; default: model's own or 1")

    def __post_init__(self) -> None:
        check(isinstance(self.group, int) and self.group >= 1, f"group must be an int >= 1, got {self.group!r}")
        check(isinstance(self.window, int) and self.window >= 1, f"window must be an int >= 1, got {self.window!r}")
        check_rope_options(self.theta, self.partial)


def grouped_scores(query: torch.Tensor, key: torch.Tensor, rotary: Rotary, q_pos: torch.Tensor, k_pos: torch.Tensor,
                   group: int, window: int) -> torch.Tensor:
    """(B, H, q, k) fp32 q.k logits: exact positions within the window, grouped ones beyond it."""
    shift = window - window // group
    near = rotate_heads(query, rotary, q_pos) @ rotate_heads(key, rotary, k_pos).transpose(-1, -2)
    far = rotate_heads(query, rotary, q_pos // group + shift) @ rotate_heads(key, rotary, k_pos // group).transpose(-1, -2)
    distance = (q_pos[:, :, None] - k_pos[:, None, :])[:, None]
    return torch.where(distance < window, near, far)


class SelfExtendAttention(nn.Module):
    """`forward(query, key, q_pos, k_pos)` -> grouped logits, for the attention function."""

    def __init__(self, rotary: Rotary, group: int, window: int) -> None:
        super().__init__()
        self.rotary, self.group, self.window = rotary, group, window

    def forward(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return grouped_scores(query, key, self.rotary, q_pos, k_pos, self.group, self.window)


class SelfExtend(AttentionScheme):
    name = "self_extend"
    causal_only = True
    Options = SelfExtendOptions
    citation = "Jin et al. 2024, LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning"

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        return resolve_rotation(options, facts)

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        rotary = plain_rotary(options, facts)
        return SelfExtendAttention(rotary, options["group"], options["window"])


register_scheme(SelfExtend())
