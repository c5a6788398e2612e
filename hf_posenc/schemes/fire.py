"""`fire`: an MLP of the log-normalised distance (Li et al. 2023, FIRE, eq. 4-6), shared by all layers.
The output layer starts at zero unless asked otherwise: a fresh patch is NoPE."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..domains import at_least, one_of, option, positive
from .base import BiasScheme, ModelFacts, OwnParameters, RelativeBias, loaded, register_scheme


@dataclass(frozen=True)
class FireOptions:
    hidden: int = option(32, "width of the MLP f (32 in Li et al. 2023)", at_least(1, int))
    c: float = option(0.1, "initial c in psi(x) = log(c x + 1)", positive("Li et al. 2023"))
    threshold: float = option(512.0, "initial L: distances are normalised by psi(max(L, i))", positive())
    init: str = option("zeros", "'zeros' (output layer starts at 0: NoPE) or 'random'", one_of("zeros", "random"))


class FireBias(RelativeBias, OwnParameters):
    """b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1); c, L learned (kept > 0)."""

    flex_backward = False  # `score` indexes the MLP's weights once per hidden unit

    def __init__(self, heads: int, hidden: int, c: float, threshold: float, zero_init: bool) -> None:
        super().__init__()
        self.heads, self.c, self.threshold, self.zero_init = heads, c, threshold, zero_init
        self.log_c = nn.Parameter(torch.empty(()))
        self.log_threshold = nn.Parameter(torch.empty(()))
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, heads))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """c and L as the options give them, the MLP as PyTorch draws a Linear, its output layer zeros unless
        `init='random'` (what loading filled is kept)."""
        for param, value in ((self.log_c, math.log(self.c)), (self.log_threshold, math.log(self.threshold))):
            if not loaded(param):
                param.fill_(value)
        for layer, zero in ((self.mlp[0], False), (self.mlp[2], self.zero_init)):
            if loaded(layer.weight):
                continue
            layer.reset_parameters()
            if zero:
                layer.weight.zero_()
                layer.bias.zero_()

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
    test_settings = {"fire": {"init": "random"}}

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        return FireBias(facts.num_heads, options["hidden"], options["c"], options["threshold"], options["init"] == "zeros")


register_scheme(Fire())
