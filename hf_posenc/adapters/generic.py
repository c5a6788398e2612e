"""The generic decoder adapter: for a model type without a hand-written adapter, an `Adapter` built
from what `discover` reads off a stock instance (`hf_posenc.view` picks it: the model, or a meta-device model
built from its config).

What the site installers cannot do for this model yet becomes a named gap (`Adapter.gaps`), so a
scheme that would need it is refused with the reason; a model whose positions cannot all be placed
is refused as a whole. Never a partial patch.

The few facts an instance does not show live in `quirks` as data, by model type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import PosEncError
from .base import Adapter, Blocks, Embeddings, NativeBias, PositionSlot, QKTap, Rotation
from .discover import OUTSIDE, Structure, discover
from .quirks import ALIBI_HEAD_DIM_POWER, KNOWN_GAPS, MASK_ADDED_TO_LOGITS, NATIVE_BIAS_SWITCHES, TRAINED_LENGTHS

ROPE_SCHEMES = {"default": "rope", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3",
                "longrope": "longrope"}
NEEDS_LOOP_HOOK = ("slot", "input", "qk_tap", "score", "kwargs")

def generic_adapter(model: nn.Module) -> Adapter:
    """The adapter of a stock model whose model_type has no hand-written adapter, read off the model (which
    model that is, and the cache, are `hf_posenc.view.read`'s).

    Raises PosEncError naming what is missing when positions enter the model somewhere it cannot place.
    """
    return adapter_from(discover(model))


def adapter_from(s: Structure) -> Adapter:
    """Turn a discovered structure into an Adapter, or refuse the model with the reason."""
    if not s.attention_layers:
        raise PosEncError(f"{s.model_type!r} has no self-attention layers with q/k projections (a state-space or "
                          "recurrent model, or an attention module discovery does not recognise): no position "
                          "scheme to swap")
    if s.unexplained:
        raise PosEncError(f"{s.model_type!r}: positions enter where the generic adapter cannot place them: "
                          f"{'; '.join(s.unexplained)}; register a hand-written adapter (hf_posenc.register_adapter)")
    # taps are kept even when the installer cannot use them yet (the qk_tap gap says why): they are data
    tap = QKTap(s.taps, packed=s.tap_kind == "packed", per_head=s.tap_per_head, layout=s.tap_layout) \
        if s.taps and s.tap_kind != "latent" else None
    native_bias = bool(s.native_bias_kind)
    return Adapter(
        name="generic",
        model_types=(s.model_type,),
        native=native_scheme(s),
        causal=s.causal,
        blocks=Blocks(
            layers=s.layers,
            attention=s.attention,
            loop=s.loop_owner,
            attention_layers=None if len(s.attention_layers) == s.num_layers else s.attention_layers,
            relay_kwargs=s.relay_kwargs,
            carry_kwargs=s.carry_kwargs,
            score_mask=not s.attention_interface and s.model_type in MASK_ADDED_TO_LOGITS,
        ),
        slot=PositionSlot(s.slot, FixedOffset(s.slot_offset), s.slot_adds_offset, s.slot_call is not None)
        if s.slot else None,
        embeddings=Embeddings(s.token_type_ids, s.other_embeddings, s.positions_field,
                              TRAINED_LENGTHS.get(s.model_type)),
        rotation=Rotation(s.rotary[0], s.rotary_layer_types,
                          s.rotary_width if s.rotary_width and s.rotary_width != s.head_dim else None)
        if s.rotary else None,
        qk=tap,
        bias=NativeBias(
            # a bias table is zeroed where it is computed; the block argument then carries zeros
            argument=s.native_bias if native_bias and not s.bias_table else None,
            switch=NATIVE_BIAS_SWITCHES.get(s.model_type) if native_bias else None,
            table=s.bias_table,
            alibi_scale=s.head_dim ** ALIBI_HEAD_DIM_POWER.get(s.model_type, 0.0)
            if s.native_bias_kind == "alibi" else 1.0,
        ),
        gaps=gaps(s),
    )


@dataclass(frozen=True)
class FixedOffset:
    """`Adapter.position_offset` read off the slot (OPT's 2, RoBERTa's padding_idx + 1): plain data."""

    rows: int

    def __call__(self, config: Any) -> int:
        return self.rows


def native_scheme(s: Structure) -> str:
    """The scheme the model was trained with, as a scheme name."""
    if s.native_bias_kind or s.bias_table:
        return "alibi" if s.native_bias_kind == "alibi" else "t5"
    if s.rotary:
        params = s.rope_parameters or {}
        if s.rotary_layer_types:
            params = next((v for v in params.values() if isinstance(v, dict)), {})
        return ROPE_SCHEMES.get(params.get("rope_type", "default"), params.get("rope_type", "rope"))
    if s.slot:
        return "learned" if s.slot_learned else "sinusoidal"
    return "nope"


def gaps(s: Structure) -> dict[str, str]:
    """Mechanism -> why the current installers cannot do it on this model."""
    found: dict[str, str] = dict(KNOWN_GAPS.get(s.model_type, {}))

    def gap(reason: str, *mechanisms: str) -> None:
        for m in mechanisms:
            found.setdefault(m, reason)

    if s.loop_owner.startswith(OUTSIDE):
        mask = ("score_mask",) if s.model_type in MASK_ADDED_TO_LOGITS else ()
        gap(f"the layer loop runs in {s.loop_owner.removeprefix(OUTSIDE)}, outside the base model, where the "
            "installers cannot hook positions in", *NEEDS_LOOP_HOOK, *mask)
    if s.slot and s.loop_owner and not s.slot.startswith(s.loop_owner + "."):
        gap(f"the position slot {s.slot} lies outside base_model.{s.loop_owner}, whose forward runs the layer "
            "loop the positions come from", "slot")
    if s.max_positions is None and s.model_type not in TRAINED_LENGTHS:
        gap(f"the config names no {s.positions_field} to size an input-site table by", "input")
    _rotary_gaps(s, gap)
    if s.slot_call and s.slot_width != s.hidden_size:
        gap(f"the model calls {s.slot} as {s.slot_call} and it returns {s.slot_width or 'an unknown number of'} "
            f"features, not hidden_size={s.hidden_size}: not a code added to the token embeddings", "slot")
    if s.slot and s.max_positions is None:
        gap(f"the config names no {s.positions_field}: a patch cannot size the slot's table, nor plain "
            "transformers rebuild it", "slot")
    if "position_ids" not in s.loop_takes and not s.slot_call:
        gap("the layer loop's forward takes no position_ids", "slot")
    if not {"input_ids", "inputs_embeds"} & set(s.loop_takes):
        gap("the layer loop's forward takes neither input_ids nor inputs_embeds, which the loop's positions are "
            "counted over", *NEEDS_LOOP_HOOK)
    if "inputs_embeds" not in s.loop_takes:
        gap("the layer loop's forward takes no inputs_embeds", "input")
    if s.tap_problem:
        gap(s.tap_problem, "qk_tap")
    if s.attention_outside:
        gap(f"q/k projections also outside the layer list ({', '.join(s.attention_outside[:3])}"
            f"{', ...' if len(s.attention_outside) > 3 else ''})", "qk_tap")
    if len(s.attention_paths) > 1:
        gap(f"self-attention sits at different paths in different blocks ({', '.join(s.attention_paths)})", "qk_tap")
    if not (s.private_kwargs or s.relay_kwargs or s.carry_kwargs):
        gap("the layer loop does not pass **kwargs through the blocks to the attention modules", "kwargs")
    if not s.attention_interface:
        gap(f"{s.attention_class} does not call attention through transformers' ALL_ATTENTION_FUNCTIONS", "score")
    elif not s.mask_interface:
        gap("the attention mask is not built by transformers.masking_utils (AttentionMaskInterface)", "score")
    return found


def _rotary_gaps(s: Structure, gap: Any) -> None:
    if not s.rotary:
        return
    both = ("rope_config", "rotary_off")
    if len(s.rotary) > 1:
        gap(f"{len(s.rotary)} rotary modules ({', '.join(s.rotary)}); the installers handle one", *both)
    if s.rotary_inside_layers:
        gap(f"the rotary module sits inside each layer ({s.rotary[0]}), not beside the layer loop", *both)
    if s.rotary_problem:
        gap(s.rotary_problem, *both)
    if len(set(s.rotary_widths.values())) > 1:
        gap(f"(cos, sin) widths differ by layer type ({s.rotary_widths}); the substitute rotation has one width",
            "rotary_off")
    if s.own_rope_types:
        gap(f"the model's own rope_type {', '.join(s.own_rope_types)} is not one transformers' ROPE_INIT_FUNCTIONS "
            "rebuilds", "rope_config")
    for rope_type, problem in s.rebuild_problems.items():
        gap(problem, f"rope_config:{rope_type}")
