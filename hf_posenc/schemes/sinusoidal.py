"""`sinusoidal`: the fixed code of Vaswani et al. 2017, computed on the fly (no table, no limit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import Domain, at_least, one_of, option, positive
from .base import DerivedBuffers, InputScheme, ModelFacts, register_scheme


# Where sin and cos go and how the frequencies are spaced, by layout name: (sin | cos in halves, frequency
# exponents i / (d/2 - 1) instead of 2i / d). Vaswani et al. interleave; Marian and Pegasus put the cos
# features in the second half; fairseq / tensor2tensor (M2M100, XGLM) also space the frequencies to reach
# 1/base exactly. Data here (torch-free) so the `layout` option's domain and the code read one table.
LAYOUTS: dict[str, tuple[bool, bool]] = {"interleaved": (False, False), "halves": (True, False),
                                         "fairseq": (True, True)}


BASE = Domain(float, low=1, low_open=True, source="Vaswani et al. 2017: wavelengths base^(2i/d)")


@dataclass(frozen=True)
class SinusoidalOptions:
    base: float = option(10_000.0, "wavelength base (10000 in Vaswani et al.)", BASE)
    scale: float | None = option(None, "multiplier; default: sized like the model's own table (else its tokens)",
                                 positive())
    layout: str | None = option(None, "where sin and cos go; default: the model's own fixed table's, else "
                                      "interleaved", one_of(*LAYOUTS))
    origin: int | None = option(None, "position whose code the first token gets; default: the model's own "
                                      "(M2M100: 2), else 0", at_least(0, int))


def sinusoidal_code(positions: torch.Tensor, dim: int, base: float, layout: str = "interleaved") -> torch.Tensor:
    """PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)) (Vaswani et al. 2017, sec. 3.5),
    or another `LAYOUTS` arrangement of the same waves; fp32, shape (*positions, dim)."""
    halves, fairseq = LAYOUTS[layout]
    steps = torch.arange(0, dim // 2 if fairseq else (dim + 1) // 2, dtype=torch.float32, device=positions.device)
    inv_freq = base ** (-steps / max(dim // 2 - 1, 1)) if fairseq else base ** (-2 * steps / dim)
    angles = positions.float()[..., None] * inv_freq
    if halves:
        code = torch.cat((angles.sin(), angles.cos()), dim=-1)
        return torch.cat((code, code.new_zeros(*code.shape[:-1], dim - code.shape[-1])), dim=-1)[..., :dim]
    code = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    return code[..., :dim]


def own_layout(table: torch.Tensor, offset: int) -> tuple[str, int] | None:
    """(layout, origin) whose code reproduces a model's fixed table: rows from `offset` on hold the code of
    positions `origin`, `origin` + 1, ... (M2M100 codes its rows by row index: origin = offset). None if
    the table is not one of them (a learned table)."""
    rows = table[offset:].float().cpu()
    for layout in LAYOUTS:
        for origin in dict.fromkeys((0, offset)):
            code = sinusoidal_code(torch.arange(rows.shape[0]) + origin, rows.shape[1], 10_000.0, layout)
            if torch.allclose(rows, code, atol=1e-4):
                return layout, origin
    return None


class SinusoidalPositions(DerivedBuffers):
    def __init__(self, dim: int, base: float, scale: float, dtype: torch.dtype, offset: int = 0,
                 layout: str = "interleaved", origin: int = 0) -> None:
        super().__init__()
        self.dim, self.base, self.scale, self.offset, self.layout, self.origin = dim, base, scale, offset, layout, origin
        self.code_dtype = dtype
        self.register_derived()

    def derived(self) -> dict[str, torch.Tensor]:
        return {"dtype_ref": torch.zeros((), dtype=self.code_dtype)}  # names the dtype the code leaves in

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        code = sinusoidal_code(position_ids - self.offset + self.origin, self.dim, self.base, self.layout)
        return (code * self.scale).to(self.dtype_ref.dtype)


class Sinusoidal(InputScheme):
    name = "sinusoidal"
    Options = SinusoidalOptions
    citation = "Vaswani et al. 2017, Attention Is All You Need, section 3.5"
    reads_weights = True  # the scale of the model's own positions (or tokens)

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out = dict(options)
        own = own_layout(facts.position_table, facts.position_offset) if facts.position_table is not None else None
        if out["scale"] is None:
            # the model's own fixed code has scale 1; any code has RMS 1/sqrt(2) per dim
            out["scale"] = 1.0 if own else round(facts.position_rms * 2**0.5, 6)
        out["layout"] = out["layout"] or (own[0] if own else "interleaved")
        out["origin"] = out["origin"] if out["origin"] is not None else (own[1] if own else 0)
        return out

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        return SinusoidalPositions(facts.hidden_size, options["base"], options["scale"], facts.dtype,
                                   facts.position_offset, options["layout"], options["origin"])


register_scheme(Sinusoidal())
