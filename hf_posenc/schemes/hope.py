"""`hope`: high-frequency rotary position encoding (Chen et al., ACL 2025, "HoPE: A Novel Positional Encoding
Without Long-Term Decay for Enhanced Context Awareness and Extrapolation", arXiv 2410.21216, sec. 5).

The paper traces the U-shaped attention and poor extrapolation of RoPE to its low-frequency components, those
that do not complete one full period within the training length L, and replaces them with
position-independent ones. The rule applied here: pair i (frequency theta_i = theta^(-2i/d)) keeps rotating
iff its period fits the training length, 2 pi / theta_i <= L; every other pair rotates by 0 (its q and k
components are compared as they are, whatever the distance). The kept pairs rotate at RoPE's own
frequencies, so HoPE is p-RoPE with p fixed by L (`hf_posenc.schemes.p_rope`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..domains import at_least, option
from .base import ModelFacts, register_scheme
from .p_rope import KeptFrequencies
from .rope import PARTIAL, THETA, Rope


TRAINED = at_least(1, int, "Chen et al. 2025 (HoPE), Hua et al. 2025 (FoPE): the training length L")


@dataclass(frozen=True)
class HopeOptions:
    original_max_position_embeddings: int | None = option(
        None, "training length L: frequencies whose period exceeds it stop rotating; default: the model's own", TRAINED)
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


def full_periods(pairs: int, theta: float, trained: int) -> int:
    """How many of `pairs` rotary pairs (frequencies theta^(-i/pairs), highest first) complete a period
    within `trained` positions: the high-frequency pairs HoPE keeps."""
    return sum(2 * math.pi * theta ** (i / pairs) <= trained for i in range(pairs))


class Hope(Rope):
    name = "hope"
    config_only = False  # no rope_parameters stop the low frequencies alone
    Options = HopeOptions
    citation = "Chen et al. 2025, HoPE: A Novel Positional Encoding Without Long-Term Decay"

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        trained = options["original_max_position_embeddings"] or facts.max_positions
        return {**super().resolve(options, facts), "original_max_position_embeddings": trained}

    def rotary(self, options: dict[str, Any], facts: ModelFacts, max_positions: int) -> nn.Module:
        rotary = super().rotary(options, facts, max_positions)
        kept = full_periods(rotary.rotated_pairs, options["theta"], options["original_max_position_embeddings"])
        return KeptFrequencies(rotary, kept)


register_scheme(Hope())
