"""`untied`: TUPE (Ke et al. 2021, "Rethinking Positional Encoding in Language Pre-training").

The token path carries no positions; the position-position term of the attention logit is computed
from a position table with its own per-head projections and added as a bias,

    b_h(i, j) = (p_i U^Q_h) . (p_j U^K_h) / sqrt(2 d_h)

and the content-position cross terms are dropped: concatenation at the query/key level. The table
starts as the model's own (when it has one), the projections small and random; `init_std=0` makes
the bias zero (NoPE) until training moves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..domains import at_least, option
from .base import register_scheme
from .base import BiasScheme, EmbeddingDerived, ModelFacts, OwnParameters, check_positions, loaded, table_rows


@dataclass(frozen=True)
class UntiedOptions:
    max_positions: int | None = option(None, "table length; default: the model's own max_position_embeddings",
                                       at_least(1, int))
    init_std: float = option(0.02, "std of the projections (and of the table when the model has none)", at_least(0))


class UntiedBias(OwnParameters, EmbeddingDerived):
    """The bias is low rank (head_dim per head), so fused paths append its factors to q and k
    instead of evaluating a (q, k) table: see `factors` and `hf_posenc.fast_attention`. The table starts as the
    model's own where it has one: a model built on the meta device and initialised draws it as the rows past the
    model's are drawn."""

    def __init__(self, table: torch.Tensor, heads: int, head_dim: int, init_std: float, copied: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim, self.init_std, self.copied = heads, head_dim, init_std, copied
        self.positions = nn.Parameter(table)
        self.query = nn.Parameter(torch.empty(table.shape[1], heads * head_dim))
        self.key = nn.Parameter(torch.empty(table.shape[1], heads * head_dim))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The projections N(0, init_std^2) (zeros at 0), unless loaded; the table is `rederive_from`'s."""
        for weight in (self.query, self.key):
            if not loaded(weight):
                weight.normal_(0.0, self.init_std) if self.init_std else weight.zero_()

    @torch.no_grad()
    def rederive_from(self, embeddings: torch.Tensor) -> None:
        """The table N(0, s^2): s the init_std, as `Untied.module` draws rows the model has none of, or the
        tokens' RMS where the table started as the model's own (drawn by its class as its tokens) or init_std is 0."""
        if not loaded(self.positions):
            rms = float(embeddings.float().pow(2).mean().sqrt())
            self.positions.normal_(0.0, rms if self.copied or not self.init_std else self.init_std)

    def factors(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (B, H, q, head_dim) and (B, H, k, head_dim) whose product is the bias: the projected
        positions p_i U^Q / sqrt(2 d_h) and p_j U^K."""
        q_pos, k_pos = table_rows(q_pos, "untied"), table_rows(k_pos, "untied")
        check_positions(q_pos, self.positions.shape[0], "untied")
        table = self.positions.float()

        def project(positions: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return (F.embedding(positions, table) @ weight.float()).unflatten(-1, (self.heads, -1)).transpose(1, 2)

        return project(q_pos, self.query) / math.sqrt(2 * self.head_dim), project(k_pos, self.key)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        q, k = self.factors(q_pos, k_pos)
        return q @ k.transpose(-1, -2)


class Untied(BiasScheme):
    name = "untied"
    Options = UntiedOptions
    citation = "Ke et al. 2021, Rethinking Positional Encoding in Language Pre-training (TUPE)"
    shift_invariant = False  # its position-position term comes from a table of absolute positions
    test_settings = {"untied": {"init_std": 0.05}}
    reads_weights = True  # the model's own table starts the position-position term

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        return {**options, "max_positions": options["max_positions"] or facts.max_positions}

    def max_positions(self, options: dict[str, Any]) -> int | None:
        return options["max_positions"]

    def fixed_table(self, options: dict[str, Any]) -> bool:
        return True

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        n, d = options["max_positions"], facts.hidden_size
        table = torch.randn(n, d) * (options["init_std"] or facts.token_rms)
        if facts.position_table is not None:
            old = facts.position_table[facts.position_offset:].float().cpu()
            table[: min(n, old.shape[0])] = old[:n]
        return UntiedBias(table.to(facts.dtype), facts.num_heads, facts.head_dim, options["init_std"],
                          copied=facts.position_table is not None).to(facts.dtype)


register_scheme(Untied())
