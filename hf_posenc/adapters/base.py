"""An adapter says, as data, where positions enter one architecture family.

Paths are dotted attribute paths relative to `model.base_model` (layers, position slot, rotary)
or to one block (attention) or to the attention module (q/k projections).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from .. import compat
from ..schemes.base import ModelFacts, Scheme


@dataclass(frozen=True)
class QKTap:
    """Where queries and keys leave their projections, before the KV cache sees them."""

    projections: tuple[str, ...]  # ("c_attn",) when packed, else (query, key)
    packed: bool = False  # one projection emitting [q | k | v]
    per_head: bool = False  # outputs are already (B, L, H, D), e.g. Qwen3's q_norm / k_norm


@dataclass(frozen=True)
class Adapter:
    name: str
    model_types: tuple[str, ...]
    native: str  # the scheme the family is pretrained with
    causal: bool
    layers: str  # the ModuleList of blocks
    attention: str  # the self-attention module inside a block
    position_slot: str | None = None  # absolute position embedding module, called with position_ids;
    # without one, input-site codes are added to the token embeddings in the layer-loop pre-hook
    position_offset: Callable[[Any], int] = field(default=lambda config: 0)  # table row of position 0
    token_type_ids: bool = False  # has a zero token-type buffer indexed by position (BERT)
    other_embeddings: tuple[str, ...] = ()  # added to token embeddings before positions (token types)
    rotary: str | None = None  # native rotary module returning (cos, sin)
    qk: QKTap | None = None

    def supports(self, scheme: Scheme) -> bool:
        if scheme.causal_only and not self.causal:
            return False
        if scheme.site == "qk":
            return self.rotary is not None or self.qk is not None
        # input: a slot or the token embeddings; score and attention: the attention interface
        return True

    def facts(self, model: nn.Module) -> ModelFacts:
        config = model.config
        base = model.base_model
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        slot = get_module(base, self.position_slot) if self.position_slot else None
        table = getattr(slot, "weight", None)
        embeddings = model.get_input_embeddings().weight
        return ModelFacts(
            hidden_size=config.hidden_size,
            num_heads=heads,
            head_dim=head_dim,
            max_positions=config.max_position_embeddings - self.position_offset(config),
            causal=self.causal,
            rope_parameters=compat.rope_parameters(config) if self.rotary else None,
            position_table=table.detach() if table is not None else None,
            position_offset=self.position_offset(config),
            token_embeddings=embeddings.detach(),
            dtype=embeddings.dtype,
            device=embeddings.device,
        )

    def attention_modules(self, model: nn.Module) -> list[nn.Module]:
        return [get_module(block, self.attention) for block in get_module(model.base_model, self.layers)]


def get_module(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path)
