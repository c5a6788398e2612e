"""What discovery reads off one model (or one stack of an encoder-decoder): the records a generic `Adapter` is
composed of, as the adapter holds them, and `Details`, what discovery saw beyond them (what the adapter's gaps are
decided from, and what the zoo catalog prints).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .base import Blocks, Embeddings, NativeBias, PositionSlot, QKTap, Rotation


@dataclass(frozen=True)
class Details:
    """What discovery saw besides the records. Paths: `base` from the model root, `rotary` from `base`."""

    composite: bool  # text settings live in a sub-config (multimodal wrappers)
    base: str
    num_layers: int
    attention_class: str | None
    attention_paths: tuple[str, ...]  # every distinct attention path seen (more than one: shared blocks)
    attention_outside: tuple[str, ...]  # q/k-holding modules outside the layer list (vision towers, 2nd stacks)
    cross_attention: bool
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int | None  # config.hidden_size: the width of the hidden states position codes are added to
    tap_kind: str | None  # "norms", "projections", "packed", "latent"
    tap_problem: str | None  # why the q/k installer cannot use the taps (None if it can)
    rotary: tuple[str, ...]  # every rotary module (the adapter's `Rotation` is the first)
    rotary_class: str | None
    rotary_inside_layers: bool
    rotary_widths: dict[str, int]  # last dim of (cos, sin) per layer type ("": called without one)
    rotary_problem: str | None
    rebuild_problems: dict[str, str]  # rope type -> why the rotary class cannot be rebuilt with it
    rope_parameters: dict[str, Any] | None
    extra_rope_keys: tuple[str, ...]  # the model's own, which a new rope_parameters keeps
    own_rope_types: tuple[str, ...]  # rope_type values transformers' ROPE_INIT_FUNCTIONS does not know
    slot_class: str | None
    slot_learned: bool  # has trainable parameters (a table, or factors of one like Reformer's axial tables)
    slot_call: str | None  # how the model calls the slot; None if with position ids alone
    slot_width: int | None  # width of the code the slot returns (table columns, or `embedding_dim`)
    native_bias_kind: str | None  # "alibi", "relative" (learned buckets), None: absent or switched off
    attention_interface: bool  # attention goes through ALL_ATTENTION_FUNCTIONS
    mask_interface: bool  # the mask comes from masking_utils (AttentionMaskInterface)
    private_kwargs: bool  # loop owner -> block -> attention pass **kwargs through
    loop_takes: tuple[str, ...]  # input_ids / position_ids / inputs_embeds accepted by the loop owner's forward
    layer_types: tuple[str, ...] | None
    sliding_window: int | None
    max_positions: int | None  # the config's positions field (ALiBi models have none)
    unexplained: tuple[str, ...] = ()  # what looks like a position but discovery cannot place: the model is refused


@dataclass(frozen=True)
class Found:
    """What discovery found in one model: the records of its generic adapter (`blocks` None: no block holds
    self-attention, and the adapter refuses the model), the scheme it was trained with, and its `details`.
    Paths as the adapter's (`adapters.base`)."""

    model_type: str
    native: str  # the scheme the model was trained with
    causal: bool
    blocks: Blocks | None
    slot: PositionSlot | None
    embeddings: Embeddings
    rotation: Rotation | None
    qk: QKTap | None  # kept even when the installer cannot use the taps (`details.tap_problem` says why)
    bias: NativeBias
    details: Details = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, nested by record (the zoo catalog writes it)."""
        return _plain(dataclasses.asdict(self))

def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value
