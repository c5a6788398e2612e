"""`cope`: contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding: Learning to
Count What's Important", arXiv 2405.18719, sec. 3).

Positions are counted by the content: a gate g_it = sigmoid(q_i . k_t) decides whether key t counts, and the
position of key j seen from query i is the number of counted keys from j up to i,

    p_ij = sum_{t=j}^{i} g_it          (causal)

which is fractional; the embedding of a fractional position interpolates the learned integer ones,
e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p], and the logit becomes q_i . (k_j + e[p_ij]).
Positions past npos_max - 1 are clamped to it. As in the paper's reference code, the gates use the scaled
product q . k / sqrt(d) and q_i . e[p] is computed once per integer p and interpolated (eq. 5-6).

Site: attention (keys enter the cache as projected). The gates sum over the keys the query sees, so the
attention function hands this module the mask too (`reads_mask`): padding, other packed documents and the
empty slots of a static cache count for nothing. Each step of a cached decode recomputes the gates over all
cached keys, so cached and uncached forwards agree. One table e is shared by heads (as in the paper) and,
as T5's bias is, by layers. Fused attention paths cannot express the counting: every call is materialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import at_least, option
from .base import AttentionScheme, ModelFacts, OwnParameters, loaded, register_scheme


@dataclass(frozen=True)
class CopeOptions:
    npos_max: int = option(64, "number of position embeddings; contextual positions past the last share it",
                           at_least(1, int, "Golovneva et al. 2024: p_max"))
    init_std: float = option(0.0, "std of the initial position embeddings; 0 (the paper's init) starts as NoPE",
                             at_least(0))


class ContextualPositions(OwnParameters):
    """`forward(query, key, q_pos, k_pos, mask)` -> fp32 logits q.k + q.e[p] (token positions are not used)."""

    reads_mask = True  # the posenc attention function passes its additive fp32 mask as `mask`

    def __init__(self, head_dim: int, npos_max: int, init_std: float) -> None:
        super().__init__()
        self.init_std = init_std
        self.embeddings = nn.Parameter(torch.empty(npos_max, head_dim))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The position embeddings N(0, init_std^2); zeros at the paper's init_std=0 (unless loaded)."""
        if not loaded(self.embeddings):
            self.embeddings.normal_(0.0, self.init_std) if self.init_std else self.embeddings.zero_()

    def forward(self, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (B, H, q, d), key (B, H, k, d) (key heads repeated), mask additive (B|1, H|1, q, k) or None
        (every key visible)."""
        q = query.float()
        logits = q @ key.float().transpose(-1, -2)
        gates = torch.sigmoid(logits * q.shape[-1] ** -0.5)
        if mask is not None:
            gates = gates * (mask > torch.finfo(mask.dtype).min / 2)
        counts = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.embeddings.shape[0] - 1)
        per_position = q @ self.embeddings.float().T  # q_i . e[p] for every integer p
        below = counts.floor()
        weight = counts - below
        low = per_position.gather(-1, below.long())
        high = per_position.gather(-1, counts.ceil().long())
        return logits + high * weight + low * (1 - weight)


class Cope(AttentionScheme):
    name = "cope"
    causal_only = True  # p_ij counts the keys between j and the query i
    Options = CopeOptions
    citation = "Golovneva et al. 2024, Contextual Position Encoding: Learning to Count What's Important"
    test_settings = {"cope": {"init_std": 0.5}}

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        return ContextualPositions(facts.head_dim, options["npos_max"], options["init_std"])


register_scheme(Cope())
