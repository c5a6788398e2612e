"""The generic decoder adapter: for a model type without a hand-written adapter, an `Adapter` built
from what `discover` reads off a stock instance (`hf_posenc.view` picks it: the model, or a meta-device model
built from its config).

What the site installers cannot do for this model yet becomes a named gap (`Adapter.gaps`), so a
scheme that would need it is refused with the reason; a model whose positions cannot all be placed
is refused as a whole. Never a partial patch.

The few facts an instance does not show live in `quirks` as data, by model type.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import PosEncError
from .base import Adapter, FixedOffset
from .discover import OUTSIDE, discover
from .found import Details, Found
from .quirks import KNOWN_GAPS, MASK_ADDED_TO_LOGITS, TRAINED_LENGTHS

NEEDS_LOOP_HOOK = ("slot", "input", "qk_tap", "score", "kwargs")
__all__ = ["FixedOffset", "adapter_from", "gaps", "generic_adapter"]  # FixedOffset: where older pickles find it


def generic_adapter(model: nn.Module) -> Adapter:
    """The adapter of a stock model whose model_type has no hand-written adapter, read off the model (which
    model that is, and the cache, are `hf_posenc.view.read`'s).

    Raises PosEncError naming what is missing when positions enter the model somewhere it cannot place.
    """
    return adapter_from(discover(model))


def adapter_from(found: Found) -> Adapter:
    """The generic adapter of what discovery found: its records, and the gaps; or the model refused with the reason."""
    if found.blocks is None:
        raise PosEncError(f"{found.model_type!r} has no self-attention layers with q/k projections (a state-space or "
                          "recurrent model, or an attention module discovery does not recognise): no position "
                          "scheme to swap")
    if found.details.unexplained:
        raise PosEncError(f"{found.model_type!r}: positions enter where the generic adapter cannot place them: "
                          f"{'; '.join(found.details.unexplained)}; register a hand-written adapter "
                          "(hf_posenc.register_adapter)")
    return Adapter("generic", (found.model_type,), found.native, found.causal, found.blocks, found.slot,
                   found.embeddings, found.rotation, found.qk, found.bias, gaps(found))


def gaps(found: Found) -> dict[str, str]:
    """Mechanism -> why the current installers cannot do it on this model (`found.blocks` must hold attention)."""
    d, blocks, model_type = found.details, found.blocks, found.model_type
    slot, loop, field = found.slot.path if found.slot else None, blocks.loop, found.embeddings.positions_field
    out: dict[str, str] = dict(KNOWN_GAPS.get(model_type, {}))

    def gap(reason: str, *mechanisms: str) -> None:
        for m in mechanisms:
            out.setdefault(m, reason)

    if loop.startswith(OUTSIDE):
        mask = ("score_mask",) if model_type in MASK_ADDED_TO_LOGITS else ()
        gap(f"the layer loop runs in {loop.removeprefix(OUTSIDE)}, outside the base model, where the "
            "installers cannot hook positions in", *NEEDS_LOOP_HOOK, *mask)
    if slot and loop and not slot.startswith(loop + "."):
        gap(f"the position slot {slot} lies outside base_model.{loop}, whose forward runs the layer "
            "loop the positions come from", "slot")
    if d.max_positions is None and model_type not in TRAINED_LENGTHS:
        gap(f"the config names no {field} to size an input-site table by", "input")
    _rotary_gaps(d, gap)
    if d.slot_call and d.slot_width != d.hidden_size:
        gap(f"the model calls {slot} as {d.slot_call} and it returns {d.slot_width or 'an unknown number of'} "
            f"features, not hidden_size={d.hidden_size}: not a code added to the token embeddings", "slot")
    if slot and d.max_positions is None:
        gap(f"the config names no {field}: a patch cannot size the slot's table, nor plain "
            "transformers rebuild it", "slot")
    if "position_ids" not in d.loop_takes and not d.slot_call:
        gap("the layer loop's forward takes no position_ids", "slot")
    if not {"input_ids", "inputs_embeds"} & set(d.loop_takes):
        gap("the layer loop's forward takes neither input_ids nor inputs_embeds, which the loop's positions are "
            "counted over", *NEEDS_LOOP_HOOK)
    if "inputs_embeds" not in d.loop_takes:
        gap("the layer loop's forward takes no inputs_embeds", "input")
    if d.tap_problem:
        gap(d.tap_problem, "qk_tap")
    if d.attention_outside:
        gap(f"q/k projections also outside the layer list ({', '.join(d.attention_outside[:3])}"
            f"{', ...' if len(d.attention_outside) > 3 else ''})", "qk_tap")
    if len(d.attention_paths) > 1:
        gap(f"self-attention sits at different paths in different blocks ({', '.join(d.attention_paths)})", "qk_tap")
    if not (d.private_kwargs or blocks.relay_kwargs or blocks.carry_kwargs):
        gap("the layer loop does not pass **kwargs through the blocks to the attention modules", "kwargs")
    if not d.attention_interface:
        gap(f"{d.attention_class} does not call attention through transformers' ALL_ATTENTION_FUNCTIONS", "score")
    elif not d.mask_interface:
        gap("the attention mask is not built by transformers.masking_utils (AttentionMaskInterface)", "score")
    return out


def _rotary_gaps(d: Details, gap: Any) -> None:
    if not d.rotary:
        return
    both = ("rope_config", "rotary_off")
    if len(d.rotary) > 1:
        gap(f"{len(d.rotary)} rotary modules ({', '.join(d.rotary)}); the installers handle one", *both)
    if d.rotary_inside_layers:
        gap(f"the rotary module sits inside each layer ({d.rotary[0]}), not beside the layer loop", *both)
    if d.rotary_problem:
        gap(d.rotary_problem, *both)
    if len(set(d.rotary_widths.values())) > 1:
        gap(f"(cos, sin) widths differ by layer type ({d.rotary_widths}); the substitute rotation has one width",
            "rotary_off")
    if d.own_rope_types:
        gap(f"the model's own rope_type {', '.join(d.own_rope_types)} is not one transformers' ROPE_INIT_FUNCTIONS "
            "rebuilds", "rope_config")
    for rope_type, problem in d.rebuild_problems.items():
        gap(problem, f"rope_config:{rope_type}")
