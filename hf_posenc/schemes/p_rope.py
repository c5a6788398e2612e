"""`p_rope`: RoPE on the fraction p of its highest frequencies (Barbero et al., ICLR 2025, "Round and Round We
Go! What makes Rotary Positional Encodings useful?", arXiv 2410.06205, sec. 6).

RoPE rotates pair i (i, i + d/2) by n * theta^(-2i/d); p-RoPE keeps pairs i < floor(p * d/2), at RoPE's own
frequencies (not respaced, unlike a partial rotary), and rotates the others by 0, so they carry no position:

    q_n . k_m = sum_{i < p d/2} Re[q_i conj(k_i) e^{i (n - m) theta_i}] + sum_{i >= p d/2} Re[q_i conj(k_i)]

p = 1 is RoPE, p = 0 is NoPE. The paper's argument: the low frequencies carry semantics, not positions, and
removing them leaves robust semantic channels. On a model rotating only part of each head, p is a fraction
of the pairs it rotates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import between, option
from .base import DerivedBuffers, ModelFacts, register_scheme
from .rope import PARTIAL, THETA, Rope


@dataclass(frozen=True)
class PRopeOptions:
    p: float = option(0.75, "fraction of RoPE's frequencies kept, highest first (0: NoPE, 1: RoPE); "
                            "0.75 is the setting Barbero et al. 2025 recommend", between(0, 1, source="Barbero et al. 2025"))
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


class KeptFrequencies(DerivedBuffers):
    """`forward(x, position_ids) -> (cos, sin)` of `rotary` on its first `kept` pairs; the other pairs get
    cos = 1, sin = 0 (a rotation by 0), exactly."""

    def __init__(self, rotary: nn.Module, kept: int) -> None:
        super().__init__()
        self.rotary, self.kept = rotary, kept
        self.register_derived()

    def derived(self) -> dict[str, torch.Tensor]:
        keep = torch.arange(self.rotary.head_dim // 2) < self.kept
        return {"keep": torch.cat((keep, keep))}

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary(x, position_ids, layer_type)
        return torch.where(self.keep, cos, torch.ones_like(cos)), torch.where(self.keep, sin, torch.zeros_like(sin))


class PRope(Rope):
    """RoPE's options and frequencies, then the pairs past the kept fraction switched off."""

    name = "p_rope"
    config_only = False  # no rope_parameters keep RoPE's frequencies on a fraction of the pairs
    Options = PRopeOptions
    citation = "Barbero et al. 2025, Round and Round We Go! What makes Rotary Positional Encodings useful?"
    test_settings = {"p_rope": {"p": 0.5}}

    def rotary(self, options: dict[str, Any], facts: ModelFacts, max_positions: int) -> nn.Module:
        rotary = super().rotary(options, facts, max_positions)
        return KeptFrequencies(rotary, int(options["p"] * rotary.rotated_pairs))


register_scheme(PRope())
