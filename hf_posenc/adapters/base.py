"""An adapter says, as data, where positions enter one architecture family.

Paths are dotted attribute paths relative to `model.base_model` (loop, layers, position slot, rotary)
or to one block (attention) or to the attention module (q/k projections).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from .. import compat
from . import quirks
from ..schemes.base import ModelFacts


@dataclass(frozen=True)
class QKTap:
    """Where queries and keys leave their projections, before the KV cache sees them."""

    projections: tuple[str, ...]  # ("c_attn",) when packed, else (query, key)
    packed: bool = False  # one projection emitting [q | k | v]
    per_head: bool = False  # outputs are already (B, L, H, D), e.g. Qwen3's q_norm / k_norm
    layout: str | None = None  # packed order of q, k, v: one of PACKED_LAYOUTS
    groups: int = 1  # query heads per key-value head


# The packed layouts the q/k tap splits (others are a qk_tap gap): "grouped" [q | k | v] and "kv_groups"
# [q_1..q_g | k | v] per key-value group (Falcon's new decoder) with any number of key-value heads; "per_head"
# [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (GPT-NeoX, BLOOM) with as many key-value as query heads.
PACKED_LAYOUTS = ("grouped", "kv_groups", "per_head")


# What a site installer does to a model, by name; an adapter's `gaps` name the ones it cannot do
# for that model yet, and why. A scheme is supported when none of the mechanisms it needs is a gap.
MECHANISMS = {
    "rope_config": "set config.rope_parameters and rebuild the model's rotary module",
    # "rope_config:<rope type>": that rebuild for one RoPE type (probed each on its own: adapters/probes.py)
    "rotary_off": "replace the model's rotary module by one that does not rotate (or by a new rotation)",
    "qk_tap": "rotate q and k as they leave their projections",
    "slot": "replace the absolute position module",
    "slot_code": "put a position code of the layer loop's positions in the absolute position module's place",
    "input": "add a position code to the token embeddings in the layer-loop pre-hook",
    "score": "run attention under a biased implementation (attention + mask interface)",
    "score_mask": "add the bias to the mask an attention module outside ALL_ATTENTION_FUNCTIONS adds to its logits",
    "kwargs": "hand positions from the layer loop to the attention modules as private kwargs",
    "native_bias": "switch off the model's own score bias",
}


def no_offset(config: Any) -> int:
    """`PositionSlot.offset` of a table whose first row is position 0."""
    return 0


@dataclass(frozen=True)
class FixedOffset:
    """`PositionSlot.offset` read off the slot (OPT's 2, RoBERTa's padding_idx + 1): plain data."""

    rows: int

    def __call__(self, config: Any) -> int:
        return self.rows


@dataclass(frozen=True)
class Blocks:
    """The layer loop and its blocks: where positions are hooked in and how they reach the self-attention."""

    layers: str  # the ModuleList of blocks
    attention: str  # the self-attention module inside a block
    loop: str = ""  # the module whose forward runs the layer loop, where positions are hooked in ("": base)
    attention_layers: tuple[int, ...] | None = None  # blocks with self-attention (hybrid SSM models); None: all
    relay_kwargs: bool = False  # blocks drop **kwargs instead of passing them to attention (StableLM)
    carry_kwargs: bool = False  # the loop calls blocks without **kwargs (BLOOM, Falcon): carried by hooks
    score_mask: bool = False  # score biases go into the mask the attention adds to its logits (quirks)


@dataclass(frozen=True)
class PositionSlot:
    """The absolute position embedding module, called with position_ids (or hooked); without one, input-site codes
    are added to the token embeddings in the layer-loop pre-hook."""

    path: str
    # table row of position 0: a module-level function or a `FixedOffset`, which pickle (a patched model's
    # `torch.save` holds its adapter, in the stock read its patch keeps)
    offset: Callable[[Any], int] = no_offset
    # The slot adds `offset` itself (OPT, BART): position ids and max_position_embeddings count from position 0,
    # not from the table's first row (RoBERTa).
    adds_offset: bool = False
    # The model calls the slot with other arguments than position ids (OPT: attention_mask, past length,
    # position_ids=...): a pre-hook on the slot turns the call into `slot(ids)` with the loop's ids.
    hooked: bool = False


@dataclass(frozen=True)
class Embeddings:
    """What the token embeddings carry besides positions, and how many positions the config says the model takes."""

    token_type_ids: bool = False  # a zero token-type buffer indexed by position (BERT)
    other: tuple[str, ...] = ()  # added to token embeddings before positions (token types)
    positions_field: str = "max_position_embeddings"  # the config field sizing the table (quirks.POSITIONS_FIELDS)
    trained_length: int | None = None  # max positions when the config names none (quirks.TRAINED_LENGTHS)


@dataclass(frozen=True)
class Rotation:
    """The model's own rotary module, returning (cos, sin)."""

    module: str
    layer_types: tuple[str, ...] = ()  # called per layer type, rope_parameters keyed by it
    dim: int | None = None  # width of (cos, sin) when only part of each head rotates


@dataclass(frozen=True)
class NativeBias:
    """The model's own score bias, which a patch switches off (none: all empty)."""

    argument: str | None = None  # block argument carrying it (BLOOM's `alibi`)
    switch: str | None = None  # base-model attribute switching it on (Falcon)
    table: str | None = None  # T5's bucket table: one layer computes the bias the stack shares (zeroed when off)
    alibi_scale: float = 1.0  # the native ALiBi's slopes over the standard ones (Falcon: 1/sqrt(head_dim))


@dataclass(frozen=True)
class Tables:
    """The modules a model's own position tables live in (None where it has none): its position slot and its
    bucket table (T5). A patch takes them out of the model and its records hold them since, so a patched model's
    stock facts are read off them (`hf_posenc.view.StockRead`) without taking the patch off."""

    slot: nn.Module | None = None
    buckets: nn.Module | None = None

    def read(self, facts: ModelFacts, model: nn.Module) -> ModelFacts:
        """`facts` with these tables' values, and `model`'s token embeddings, dtype and device, as they are now."""
        table, embeddings = _table(self.slot), model.get_input_embeddings().weight
        buckets = self.buckets.weight if self.buckets is not None else None
        return dataclasses.replace(
            facts, position_table=_values(table) if table is not None else None,
            bias_table=_values(buckets) if buckets is not None else None, token_embeddings=_values(embeddings),
            dtype=embeddings.dtype, device=embeddings.device)


@dataclass(frozen=True)
class Adapter:
    """Where positions enter one family, as a composition of small records: its blocks, its position slot, what its
    token embeddings carry, its rotation, where q and k leave their projections, its native bias; and what the
    installers cannot do there yet (`gaps`). A new mechanism is a field on the record whose part of the model it
    reads, and the site that reads it (docs/extending.md)."""

    name: str
    model_types: tuple[str, ...]
    native: str  # the scheme the family is pretrained with
    causal: bool
    blocks: Blocks
    slot: PositionSlot | None = None
    embeddings: Embeddings = Embeddings()
    rotation: Rotation | None = None
    qk: QKTap | None = None
    bias: NativeBias = NativeBias()
    gaps: Mapping[str, str] = field(default_factory=dict)  # mechanism -> why it cannot be done here yet

    def tables(self, model: nn.Module) -> Tables:
        """The modules `model`'s own position tables live in now."""
        base = model.base_model
        return Tables(get_module(base, self.slot.path) if self.slot else None,
                      get_module(base, self.bias.table) if self.bias.table else None)

    def facts(self, model: nn.Module) -> ModelFacts:
        """What a scheme may know about `model` (read off its config, its tables and its token embeddings now)."""
        tables = self.tables(model)
        table, embeddings = _table(tables.slot), model.get_input_embeddings().weight
        position_offset = self.slot.offset(model.config) if self.slot else 0
        ids_offset = 0 if self.slot and self.slot.adds_offset else position_offset
        config = compat.text_config(model.config)
        rope = compat.rope_parameters(config) if self.rotation else None
        heads = config.num_attention_heads
        if "num_attention_heads" in getattr(type(config), "attribute_map", {}):
            # an alias of one stack's field (BART, Whisper: the encoder's); the attention module knows its own
            heads = getattr(self.attention_modules(model)[0], "num_heads", heads)
        # quirks.head_dim, read as data: the config's own field, else hidden_size / heads
        head_dim = getattr(config, quirks.HEAD_DIM_FIELDS.get(getattr(config, "model_type", ""), "head_dim"), None) \
            or config.hidden_size // heads
        if rope and self.rotation.layer_types:  # options resolve against the full-attention layers (Gemma 2/3)
            rope = dict(rope.get("full_attention") or rope[self.rotation.layer_types[0]])
        return tables.read(ModelFacts(
            # where input codes are added: the table's width (OPT-350m projects its 512-wide tokens to 1024
            # before adding positions), else the tokens' (ELECTRA: embedding_size)
            hidden_size=(table if table is not None else embeddings).shape[-1],
            num_heads=heads,
            head_dim=head_dim,
            # ALiBi models (BLOOM, MPT) name no length: their trained length if known, else 0 (an input-site gap)
            max_positions=(getattr(config, self.embeddings.positions_field, None) or self.embeddings.trained_length
                           or 0) - ids_offset,
            causal=self.causal,
            rope_parameters=rope,
            alibi_scale=self.bias.alibi_scale,
            position_offset=position_offset,
            ids_offset=ids_offset,
            bias_max_distance=getattr(config, "relative_attention_max_distance", None) if self.bias.table else None,
        ), model)

    def ids_offset(self, config: Any) -> int:
        """What position ids passed to the model add to a position (the offset unless the slot adds it)."""
        return 0 if self.slot is None or self.slot.adds_offset else self.slot.offset(config)

    def at_loop(self, name: str) -> str:
        """Path from the base model of `name` on the loop owner (where a patch puts its modules)."""
        return f"{self.blocks.loop}.{name}" if self.blocks.loop else name

    def from_loop(self, path: str) -> str:
        """`path` (from the base model) relative to the loop owner, which must hold it."""
        loop = self.blocks.loop
        if not loop:
            return path
        if not path.startswith(loop + "."):
            from ..errors import PosEncError

            raise PosEncError(f"{path} lies outside the layer loop's module {loop}, where positions are hooked in")
        return path[len(loop) + 1:]

    def attention_blocks(self, model: nn.Module) -> list[nn.Module]:
        blocks = list(get_module(model.base_model, self.blocks.layers))
        keep = range(len(blocks)) if self.blocks.attention_layers is None else self.blocks.attention_layers
        return [blocks[i] for i in keep]

    def attention_modules(self, model: nn.Module) -> list[nn.Module]:
        return [get_module(block, self.blocks.attention) for block in self.attention_blocks(model)]


# model_type -> its hand-written adapter (`register_adapter`); any other model type is read by discovery
ADAPTERS: dict[str, Adapter] = {}


def register_adapter(adapter: Adapter) -> Adapter:
    """Use `adapter` instead of the generic one for its model types (docs/extending.md); once per type.

    Args:
        adapter: an `Adapter` naming where positions enter those model types.
    """
    for model_type in adapter.model_types:  # all checked before any is taken: no half-registered adapter
        if model_type in ADAPTERS:
            raise ValueError(f"model_type {model_type!r} already has adapter {ADAPTERS[model_type].name!r}")
    ADAPTERS.update(dict.fromkeys(adapter.model_types, adapter))
    return adapter


def _table(slot: nn.Module | None) -> torch.Tensor | None:
    """A learned table's weight, or a fixed table kept as a buffer (M2M100's `weights`); not Reformer's axial
    factors (a ParameterList), which no table-reading scheme takes."""
    return next((t for t in (getattr(slot, "weight", None), getattr(slot, "weights", None))
                 if isinstance(t, torch.Tensor)), None)


def _values(tensor: torch.Tensor) -> torch.Tensor:
    """A model tensor as a scheme reads it to build its own modules. On the meta device (big models, FSDP2) it has
    no values yet: ones of its shape stand in (scales read off them are 1), and the modules built from them go onto
    the meta device too, where loading or `init_weights` gives them theirs."""
    return torch.ones(tensor.shape, dtype=tensor.dtype, device="cpu") if tensor.is_meta else tensor.detach()


def get_module(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path)
