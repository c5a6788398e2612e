"""Options of the schemes that choose which rotation frequencies act (issue 30): p-RoPE, HoPE, FoPE and PoPE.
Torch-free, like every options module."""

from __future__ import annotations

from dataclasses import dataclass

from ..domains import at_least, between, one_of, option
from .rotary import PARTIAL, THETA

TRAINED = at_least(1, int, "Chen et al. 2025 (HoPE), Hua et al. 2025 (FoPE): the training length L")


@dataclass(frozen=True)
class PRopeOptions:
    p: float = option(0.75, "fraction of RoPE's frequencies kept, highest first (0: NoPE, 1: RoPE); "
                            "0.75 is the setting Barbero et al. 2025 recommend", between(0, 1, source="Barbero et al. 2025"))
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


@dataclass(frozen=True)
class HopeOptions:
    original_max_position_embeddings: int | None = option(
        None, "training length L: frequencies whose period exceeds it stop rotating; default: the model's own", TRAINED)
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


@dataclass(frozen=True)
class FopeOptions:
    original_max_position_embeddings: int | None = option(
        None, "training length L: frequencies whose period exceeds it are zeroed; default: the model's own", TRAINED)
    sigma: float = option(0.3, "std of the initial off-diagonal Fourier coefficients (0: RoPE with the clipping)",
                          at_least(0, source="Hua et al. 2025"))
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


@dataclass(frozen=True)
class PopeOptions:
    theta: float | None = option(None, "base of the frequencies theta^(-c/d), one per head dimension; default: the "
                                       "model's own rotary base, else 10000", THETA)
    phase_bias: str = option("learned", "'learned': a trainable phase offset per head and component, starting at 0 "
                                        "(Gopalakrishnan et al. 2025); 'none': phases from positions alone",
                             one_of("learned", "none"))
