"""The position code itself: is a shift a linear map of it, and where does its energy sit?

Two of the questions the add-vs-concatenate debate keeps asking:
- *Why sine and cosine?* Vaswani et al. 2017 (section 3.5) chose them because PE(p+k) is a fixed
  linear function (a block rotation) of PE(p) for every offset k, so attention can learn relative
  positions. `shift_fit` measures how true that is of any table: R^2 of the least-squares map
  PE(p+k) ~ M_k PE(p). It is 1 for the sinusoidal code by construction; a learned table gets what
  training gave it, and a random table the chance level of the same fit.
- *Are the first dimensions unusable?* If positions sat in a few embedding dimensions, or in the
  token embedding's main directions, adding them would crowd the words. `energy_by_direction` gives
  the share of position energy (and of its variation over positions) per embedding dimension and per
  singular direction of the token embedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import PosEncError
from .geometry import exact, principal_basis


def default_rank(num_positions: int, d: int) -> int:
    """The fit's width: at most a quarter of the positions, so every offset fitted keeps at least two
    positions per unknown of a row of M_k (with fewer, least squares interpolates any table: R^2 = 1)."""
    return max(1, min(d, num_positions // 4))


def default_offsets(num_positions: int, rank: int, count: int = 24) -> list[int]:
    """Offsets 1..L-2r, spaced evenly on a log scale (near offsets matter most)."""
    top = num_positions - 2 * rank
    if top < 1:
        raise PosEncError(f"{num_positions} positions are too few for a shift fit of rank {rank}; "
                          f"need at least {2 * rank + 1}")
    grid = torch.logspace(0, torch.log10(torch.tensor(float(top))), count).round().long()
    return sorted(set(grid.tolist()))


def shift_r2(coords: Tensor, offset: int) -> float:
    """R^2 of the least-squares M with coords[p + offset] ~ coords[p] M over every p that fits."""
    x, y = coords[:-offset], coords[offset:]
    m = torch.linalg.lstsq(x, y, driver="gelsd").solution
    residual = (y - x @ m).pow(2).sum()
    total = (y - y.mean(0)).pow(2).sum()
    return float(1 - residual / total) if total > 0 else 1.0


def shift_fit(positions: Tensor, offsets: Sequence[int] | None = None, rank: int | None = None,
              seed: int = 0) -> dict[str, Any]:
    """How linear a shift of the code is: R^2 of PE(p+k) ~ M_k PE(p) for each offset k, fitted by least
    squares over the positions p in the top-`rank` principal coordinates of the table.

    Args:
        positions: the vectors added at positions 0..L-1, (L, d).
        offsets: the k to fit (each in 1..L-2*rank); default: ~24 log-spaced.
        rank: principal directions kept (default `default_rank`); with rank = d (L >= 4d) nothing is
            dropped and the sinusoidal code fits exactly.
        seed: the random table (same shape and scale) whose R^2 is the chance level of the fit.
    Returns:
        {"rank", "num_positions", "offsets", "r2", "random_r2"}.
    """
    n, d = positions.shape
    rank = default_rank(n, d) if rank is None else rank
    if not 1 <= rank <= d:
        raise PosEncError(f"rank must be in 1..{d} (the width of the position vectors), got {rank}")
    offsets = default_offsets(n, rank) if offsets is None else list(offsets)
    bad = [k for k in offsets if not 1 <= k <= n - 2 * rank]
    if bad or not offsets:
        raise PosEncError(f"offsets must be in 1..{n - 2 * rank} (L - 2*rank, so the fit does not interpolate), "
                          f"got {bad or offsets}")
    random = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def coords(table: Tensor) -> Tensor:
        return exact(table) @ principal_basis(table, k=rank)

    ours, chance = coords(positions), coords(random * exact(positions).std())
    return {"rank": rank, "num_positions": n, "offsets": offsets,
            "r2": [shift_r2(ours, k) for k in offsets], "random_r2": [shift_r2(chance, k) for k in offsets]}


def _shares(values: Tensor) -> list[float]:
    """Column shares of the squared entries."""
    energy = values.pow(2).sum(0)
    return (energy / energy.sum().clamp_min(1e-300)).tolist()


def energy_by_direction(positions: Tensor, tokens: Tensor) -> dict[str, Any]:
    """Where the position vectors put their energy: per embedding dimension and per right singular
    direction of the token embedding (largest token energy first), as shares summing to 1.

    "energy" is the squared norm of the vectors as added; "variation" is that of the vectors minus
    their mean over positions, i.e. what tells positions apart (a constant direction adds energy but
    no position information).
    """
    if positions.shape[1] != tokens.shape[1]:
        raise PosEncError(f"token vectors have width {tokens.shape[1]} but position vectors {positions.shape[1]}")
    p = exact(positions)
    varied = p - p.mean(0)
    _, s, vh = torch.linalg.svd(exact(tokens), full_matrices=False)
    return {
        "per_dimension": {"energy": _shares(p), "variation": _shares(varied)},
        "per_token_direction": {"energy": _shares(p @ vh.T), "variation": _shares(varied @ vh.T),
                                "token_energy": (s**2 / (s**2).sum()).tolist()},
    }


def quarter_shares(shares: Sequence[float]) -> dict[str, float]:
    """Shares summed over the first and the last quarter of the directions (uniform: 0.25 each)."""
    q = max(1, len(shares) // 4)
    return {"first_quarter": float(sum(shares[:q])), "last_quarter": float(sum(shares[-q:]))}


def format_encoding(fit: dict[str, Any], energy: dict[str, Any]) -> str:
    picks = sorted({0, len(fit["offsets"]) // 2, len(fit["offsets"]) - 1})
    r2 = ", ".join(f"k={fit['offsets'][i]}: {fit['r2'][i]:.3f} (random {fit['random_r2'][i]:.3f})" for i in picks)
    dims = quarter_shares(energy["per_dimension"]["variation"])
    tok = quarter_shares(energy["per_token_direction"]["variation"])
    return "\n".join([
        f"PE(p+k) ~ M_k PE(p) (rank {fit['rank']} least squares; the sinusoidal code gives 1): R^2 {r2}",
        (f"position variation in the first / last quarter of embedding dims: {dims['first_quarter']:.2f} / "
         f"{dims['last_quarter']:.2f}; along the token embedding's top / bottom quarter of singular directions: "
         f"{tok['first_quarter']:.2f} / {tok['last_quarter']:.2f} (uniform: 0.25)"),
    ])
