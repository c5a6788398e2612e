"""Subspace geometry: how much of the token subspace the position subspace overlaps, against chance."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..errors import PosEncError

ENERGY = 0.9  # default subspace rank: fewest principal directions that hold 90% of the energy


def exact(vectors: Tensor) -> Tensor:
    """float64 on the CPU, for the SVDs and angles: the tables are small, and some devices have no float64 (MPS)."""
    return vectors.detach().cpu().double()


def principal_basis(vectors: Tensor, k: int | None = None, energy: float = ENERGY) -> Tensor:
    """Orthonormal basis (d, k) of the top-k principal directions of the rows of `vectors`.

    Uncentred (right singular vectors), because what the model adds is the vectors themselves,
    mean included. `k=None`: the fewest directions that hold `energy` of the squared norm.
    """
    _, s, vh = torch.linalg.svd(exact(vectors), full_matrices=False)
    if k is None:
        share = (s**2).cumsum(0) / (s**2).sum()
        k = int((share < energy).sum()) + 1
    if not 0 < k <= vh.shape[0]:
        raise PosEncError(f"subspace dimension must be in 1..{vh.shape[0]} (rank of the vectors), got {k}")
    return vh[:k].T


def principal_angles(a: Tensor, b: Tensor) -> Tensor:
    """Principal angles in degrees, ascending, between span(a) and span(b); a (d, p), b (d, q) orthonormal.

    cos(theta_i) are the singular values of a^T b (Bjorck & Golub 1973). Computed in fp64; the cosines
    are clamped to [0, 1] against rounding.
    """
    cos = torch.linalg.svdvals(exact(a).T @ exact(b)).clamp(0.0, 1.0)
    return torch.rad2deg(torch.arccos(cos)).sort().values


def energy_share(vectors: Tensor, basis: Tensor) -> float:
    """Share of the rows' squared norm that lies in span(basis): ||V B||^2 / ||V||^2."""
    v = exact(vectors)
    return float((v @ exact(basis)).pow(2).sum() / v.pow(2).sum())


def random_basis(d: int, k: int, seed: int) -> Tensor:
    """A uniformly (Haar) distributed k-dim subspace of R^d: QR of a Gaussian matrix."""
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64)).Q


def _angle_stats(angles: Tensor) -> dict[str, float]:
    return {"min": float(angles.min()), "median": float(angles.median()), "mean": float(angles.mean()),
            "max": float(angles.max())}


def subspace_geometry(
    tokens: Tensor, positions: Tensor, top_k: int | None = None, pos_dim: int | None = None, seeds: int = 5
) -> dict[str, Any]:
    """Are the token subspace and the position subspace nearly orthogonal, compared with chance?

    Args:
        tokens: token embedding matrix (vocab, d); its top-`top_k` principal subspace is compared.
        positions: the position vectors actually added (L, d); their top-`pos_dim` principal subspace.
        top_k, pos_dim: subspace dimensions; None = the fewest holding 90% of the energy.
        seeds: random `top_k`-dim subspaces drawn as the baseline (mean and std reported).
    """
    d = tokens.shape[1]
    if positions.shape[1] != d:
        raise PosEncError(f"token vectors have width {d} but position vectors {positions.shape[1]}")
    if seeds < 2:
        raise PosEncError(f"the random baseline needs at least 2 seeds for a std, got {seeds}")
    tok, pos = principal_basis(tokens, top_k), principal_basis(positions, pos_dim)
    angles = principal_angles(tok, pos)
    randoms = [random_basis(d, tok.shape[1], seed) for seed in range(seeds)]
    rand_angles = torch.stack([principal_angles(r, pos) for r in randoms])
    rand_energy = torch.tensor([energy_share(positions, r) for r in randoms])
    rand_stats = [_angle_stats(a) for a in rand_angles]
    return {
        "d": d,
        "top_k": tok.shape[1],
        "pos_dim": pos.shape[1],
        "num_positions": positions.shape[0],
        "token_energy_in_top_k": energy_share(tokens, tok),
        "position_energy_in_pos_dim": energy_share(positions, pos),
        "angles_deg": angles.tolist(),
        "angles": _angle_stats(angles),
        "position_energy_in_token_subspace": energy_share(positions, tok),
        "random": {
            "seeds": seeds,
            "angles_deg_mean": rand_angles.mean(0).tolist(),
            "angles_deg_std": rand_angles.std(0).tolist(),
            "angles": {key: {"mean": float(torch.tensor([s[key] for s in rand_stats]).mean()),
                             "std": float(torch.tensor([s[key] for s in rand_stats]).std())}
                       for key in rand_stats[0]},
            "position_energy_in_token_subspace": {"mean": float(rand_energy.mean()), "std": float(rand_energy.std()),
                                                  "expected": tok.shape[1] / d},
        },
    }


def format_geometry(geo: dict[str, Any]) -> str:
    a, r = geo["angles"], geo["random"]
    ra, re = r["angles"], r["position_energy_in_token_subspace"]
    return "\n".join([
        (f"token subspace: top {geo['top_k']} of d={geo['d']} principal directions "
        f"({geo['token_energy_in_top_k']:.0%} of token energy); position subspace: top {geo['pos_dim']} "
        f"({geo['position_energy_in_pos_dim']:.0%} of the energy of positions 0..{geo['num_positions'] - 1})"),
        (f"principal angles (deg)  min {a['min']:5.1f}  median {a['median']:5.1f}  mean {a['mean']:5.1f}  "
        f"max {a['max']:5.1f}"),
        (f"random {geo['top_k']}-dim (n={r['seeds']})  min {ra['min']['mean']:5.1f}  median {ra['median']['mean']:5.1f}"
        f"  mean {ra['mean']['mean']:5.1f}  max {ra['max']['mean']:5.1f}  (std of mean {ra['mean']['std']:.2f})"),
        (f"position energy in token subspace: {geo['position_energy_in_token_subspace']:.3f}  "
        f"random: {re['mean']:.3f} +- {re['std']:.3f} (expected k/d = {re['expected']:.3f})"),
    ])


def encoding_by_distance(positions: Tensor) -> dict[str, list[float]]:
    """Mean dot product and cosine of position i with position i + delta, for each distance delta."""
    p = exact(positions)
    dots = p @ p.T
    norms = p.norm(dim=-1)
    cosines = dots / (norms[:, None] * norms[None, :]).clamp_min(1e-12)
    n = p.shape[0]
    return {"distance": list(range(n)),
            "dot": [float(dots.diagonal(delta).mean()) for delta in range(n)],
            "cosine": [float(cosines.diagonal(delta).mean()) for delta in range(n)]}
