"""Options of CoPE, contextual position encoding (issue 30). Torch-free, like every options module."""

from __future__ import annotations

from dataclasses import dataclass

from ..domains import at_least, option


@dataclass(frozen=True)
class CopeOptions:
    npos_max: int = option(64, "number of position embeddings; contextual positions past the last share it",
                           at_least(1, int, "Golovneva et al. 2024: p_max"))
    init_std: float = option(0.0, "std of the initial position embeddings; 0 (the paper's init) starts as NoPE",
                             at_least(0))
