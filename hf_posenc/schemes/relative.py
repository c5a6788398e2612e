"""Learned relative biases on attention scores, shared by all layers (as T5 shares its table):

- `t5`: one scalar per (head, log-bucketed distance) (Raffel et al. 2020, sec. 2.1)
- `fire`: an MLP of the log-normalised distance (Li et al. 2023, FIRE, eq. 4-6)
- `kerple`: a conditionally positive definite kernel, -r1 * log(1 + r2 |i - j|) or -r1 |i - j|^r2
  (Chi et al. 2022, KERPLE, sec. 4)

Each starts at zero bias unless asked otherwise, so a fresh patch is NoPE and training learns the bias.
Each is a `RelativeBias`: one elementwise formula `score(head, q_pos, k_pos)` serves the materialised
(B, H, q, k) tensor and the fused kernels of `hf_posenc.fast_attention`, which evaluate it score by score.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..options.bias import FireOptions, KerpleOptions, T5Options
from ..registry import register_scheme
from .base import BiasScheme, ModelFacts


class RelativeBias(nn.Module):
    """A logit bias given element by element: `score(head, q_pos, k_pos)` takes broadcastable tensors
    (or the 0-d ones FlexAttention's score_mod sees) and returns fp32; `forward` materialises it.
    Biases of the distance alone define `by_distance(head, distance)` instead, which lets fused paths
    build a (q, k) block as a strided view of one row of distances (a Toeplitz matrix)."""

    heads: int
    # Whether Inductor can lower FlexAttention's backward through `score`: it refuses a score_mod that
    # indexes one trainable tensor more than once ("multiple indexing operations"); such terms train chunked.
    flex_backward: bool = True

    def score(self, head: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return self.by_distance(head, q_pos - k_pos)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(B, H, q, k) fp32 bias for (B, q) query and (B, k) key positions."""
        head = torch.arange(self.heads, device=q_pos.device)[None, :, None, None]
        return self.score(head, q_pos[:, None, :, None], k_pos[:, None, None, :])


def t5_bucket(distance: torch.Tensor, causal: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Half the buckets are exact small distances, the rest grow logarithmically up to max_distance;
    bidirectional models spend half of them on keys after the query. Float arithmetic until the end
    (exact for integers): the CPU flex kernel miscompiles an int64 `where`."""
    n, offset = distance.float(), 0.0
    if causal:
        n = n.clamp(min=0)
    else:
        num_buckets //= 2
        offset = (n < 0).float() * num_buckets  # key after query
        n = n.abs()
    exact = num_buckets // 2
    log_ratio = torch.log(n.clamp(min=1) / exact) / math.log(max_distance / exact)
    large = (exact + torch.floor(log_ratio * (num_buckets - exact))).clamp(max=num_buckets - 1)
    return (offset + torch.where(n < exact, n, large)).long()


class T5Bias(RelativeBias):
    def __init__(self, heads: int, causal: bool, num_buckets: int, max_distance: int, init_std: float,
                 table: torch.Tensor | None = None) -> None:
        super().__init__()
        self.heads, self.causal, self.num_buckets, self.max_distance = heads, causal, num_buckets, max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, heads)
        with torch.no_grad():
            if table is not None:
                self.relative_attention_bias.weight.copy_(table)
            elif init_std:
                nn.init.normal_(self.relative_attention_bias.weight, std=init_std)
            else:
                nn.init.zeros_(self.relative_attention_bias.weight)

    def by_distance(self, head: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        bucket = t5_bucket(distance, self.causal, self.num_buckets, self.max_distance)
        return self.relative_attention_bias.weight[bucket, head].float()


class T5(BiasScheme):
    name = "t5"
    Options = T5Options
    citation = "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5), section 2.1"

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out, own = dict(options), facts.bias_table
        out["num_buckets"] = out["num_buckets"] or (own.shape[0] if own is not None else 32)
        out["max_distance"] = out["max_distance"] or facts.bias_max_distance or 128
        fits = own is not None and tuple(own.shape) == (out["num_buckets"], facts.num_heads)
        if out["init"] == "copy" and not fits:
            from ..errors import PosEncError

            raise PosEncError(f"t5 init='copy' needs the model's own bucket table of shape ({out['num_buckets']}, "
                              f"{facts.num_heads}); this model has {tuple(own.shape) if own is not None else 'none'}")
        out["init"] = out["init"] or ("copy" if fits and not out["init_std"] else "normal" if out["init_std"] else "zeros")
        return out

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        table = facts.bias_table if options["init"] == "copy" else None
        std = options["init_std"] if options["init"] == "normal" else 0.0
        return T5Bias(facts.num_heads, facts.causal, options["num_buckets"], options["max_distance"], std, table)


class FireBias(RelativeBias):
    """b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1); c, L learned (kept > 0)."""

    flex_backward = False  # `score` indexes the MLP's weights once per hidden unit

    def __init__(self, heads: int, hidden: int, c: float, threshold: float, zero_init: bool) -> None:
        super().__init__()
        self.heads = heads
        self.log_c = nn.Parameter(torch.tensor(math.log(c)))
        self.log_threshold = nn.Parameter(torch.tensor(math.log(threshold)))
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, heads))
        if zero_init:
            nn.init.zeros_(self.mlp[2].weight)
            nn.init.zeros_(self.mlp[2].bias)

    def score(self, head: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        c = self.log_c.float().exp()
        scale = torch.maximum(q_pos.float() + 1, self.log_threshold.float().exp())
        x = torch.log1p(c * (q_pos - k_pos).abs().float()) / torch.log1p(c * scale)
        first, last = self.mlp[0], self.mlp[2]
        # The one-input MLP unit by unit: a sum over hidden units would be a reduction, which a
        # score_mod cannot hold; this way the bias stays pointwise (and no (..., hidden) tensor exists).
        out = last.bias[head].float()
        for unit in range(first.out_features):
            out = out + F.relu(x * first.weight[unit, 0].float() + first.bias[unit].float()) * last.weight[head, unit].float()
        return out

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(B, H, q, k) fp32, as `score` but in a few passes: an MLP of one input with ReLU units is
        piecewise linear, with a kink where each unit switches on, so each score is slope * x + intercept
        of the piece x falls in (the pieces' coefficients are differentiable in every weight)."""
        c = self.log_c.float().exp()
        scale = torch.maximum(q_pos.float() + 1, self.log_threshold.float().exp())
        distance = (q_pos[:, :, None] - k_pos[:, None, :]).abs().float()
        x = torch.log1p(c * distance) / torch.log1p(c * scale)[:, :, None]
        slope, intercept, kinks = self.pieces()
        piece = torch.bucketize(x.detach(), kinks)
        return torch.addcmul(intercept[:, piece], slope[:, piece], x).transpose(0, 1)

    def pieces(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(H, U + 1) slopes and intercepts of the MLP between its U sorted kinks, and the kinks. Piece
        p holds x in (kinks[p - 1], kinks[p]]; a unit with kink of rank r is on in pieces > r if its
        weight is positive, <= r if negative; a unit of weight 0 is on everywhere or nowhere."""
        first, last = self.mlp[0], self.mlp[2]
        w1, b1, w2 = first.weight[:, 0].float(), first.bias.float(), last.weight.float()
        with torch.no_grad():  # where the kinks are decides which units are on; no gradient flows there
            kink = torch.where(w1 != 0, -b1 / torch.where(w1 != 0, w1, 1.0), torch.inf)
            kinks, order = kink.sort()
            rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0], device=order.device))
            piece = torch.arange(order.shape[0] + 1, device=order.device)[:, None]
            on = torch.where(w1 > 0, piece > rank, torch.where(w1 < 0, piece <= rank, b1 > 0)).float()
        slope = (on * w1) @ w2.T
        intercept = (on * b1) @ w2.T + last.bias.float()
        return slope.T, intercept.T, kinks


class Fire(BiasScheme):
    name = "fire"
    Options = FireOptions
    citation = "Li et al. 2023, Functional Interpolation for Relative Positions Improves Long Context Transformers"

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        return FireBias(facts.num_heads, options["hidden"], options["c"], options["threshold"], options["init"] == "zeros")


class KerpleBias(RelativeBias):
    """Per-head r1, r2 kept positive through a log parametrisation."""

    def __init__(self, heads: int, variant: str, r1: float, r2: float) -> None:
        super().__init__()
        self.heads, self.variant = heads, variant
        self.log_r1 = nn.Parameter(torch.full((heads,), math.log(r1)))
        self.log_r2 = nn.Parameter(torch.full((heads,), math.log(r2)))

    def by_distance(self, head: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        distance = distance.abs().float()
        r1, r2 = self.log_r1[head].float().exp(), self.log_r2[head].float().exp()
        if self.variant == "log":
            return -r1 * torch.log1p(r2 * distance)
        return -r1 * distance.pow(r2.clamp(max=2.0))


class Kerple(BiasScheme):
    name = "kerple"
    Options = KerpleOptions
    citation = "Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation"

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        return KerpleBias(facts.num_heads, options["variant"], options["r1"], options["r2"])


register_scheme(T5())
register_scheme(Fire())
register_scheme(Kerple())
