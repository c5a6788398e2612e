"""Options of the input-site schemes (learned, sinusoidal, concat) and of NoPE."""

from __future__ import annotations

from dataclasses import dataclass

from ..domains import Domain, at_least, one_of, option, positive

INITS = ("copy", "interpolate", "sinusoidal", "normal", "zeros")
CODES = ("sinusoidal", "learned")
# Where sin and cos go and how the frequencies are spaced, by layout name: (sin | cos in halves, frequency
# exponents i / (d/2 - 1) instead of 2i / d). Vaswani et al. interleave; Marian and Pegasus put the cos
# features in the second half; fairseq / tensor2tensor (M2M100, XGLM) also space the frequencies to reach
# 1/base exactly. Data here (torch-free) so the `layout` option's domain and the code read one table.
LAYOUTS: dict[str, tuple[bool, bool]] = {"interleaved": (False, False), "halves": (True, False),
                                         "fairseq": (True, True)}
BASE = Domain(float, low=1, low_open=True, source="Vaswani et al. 2017: wavelengths base^(2i/d)")


@dataclass(frozen=True)
class LearnedOptions:
    max_positions: int | None = option(None, "table length; default: the model's own max_position_embeddings",
                                       at_least(1, int))
    init: str | None = option(None, "initial table; default: copy the model's table if it has one, else normal",
                              one_of(*INITS))


@dataclass(frozen=True)
class SinusoidalOptions:
    base: float = option(10_000.0, "wavelength base (10000 in Vaswani et al.)", BASE)
    scale: float | None = option(None, "multiplier; default: sized like the model's own table (else its tokens)",
                                 positive())
    layout: str | None = option(None, "where sin and cos go; default: the model's own fixed table's, else "
                                      "interleaved", one_of(*LAYOUTS))
    origin: int | None = option(None, "position whose code the first token gets; default: the model's own "
                                      "(M2M100: 2), else 0", at_least(0, int))


@dataclass(frozen=True)
class ConcatOptions:
    d_pos: int = option(None, "dims given to positions, < hidden size (0 is NoPE); required",
                        Domain(int, low=0, below="hidden_size"))
    code: str = option("sinusoidal", "position code in the complement", one_of(*CODES))
    max_positions: int | None = option(None, "table length for code='learned'; default: the model's own",
                                       at_least(1, int))
    base: float = option(10_000.0, "wavelength base for code='sinusoidal'", BASE)
    scale: float | None = option(None, "code multiplier; default: position vectors as long as the model's own",
                                 positive())


@dataclass(frozen=True)
class NopeOptions:
    """NoPE takes no options."""
