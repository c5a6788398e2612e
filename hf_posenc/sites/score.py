"""Score site (alibi, t5, fire, kerple, untied): a bias on the attention logits.

The scheme's bias module lives on the layer loop's module (the base model, OPT's decoder) as `posenc_bias`;
the layer-loop hook hands it and the positions of queries and keys to the posenc attention function, which
adds the bias whatever mask arrives. Families whose attention bypasses ALL_ATTENTION_FUNCTIONS but adds the
mask it is handed to its scaled logits (`Blocks.score_mask`: BLOOM, Falcon) get the bias folded into that
mask by a pre-hook instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import compat
from ..attention import BIAS_KWARG, POSITIONS_KWARG, implementation_for, position_mask
from ..errors import PosEncError
from .base import LayerLoop, PatchHook, add_scheme_module, install_biased_attention, remove_native_positions
from .entry import Entry, rotary_off, slot_needs

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..state import PatchState
    from ..schemes.base import Scheme

BIAS_MODULE = "posenc_bias"
MASK_ARGUMENT = "attention_mask"
TITLE = "attention scores (bias)"  # what a model card calls it
PROBE = ("alibi", {})  # the scheme standing for this site in the self-check's "takes effect"


def needs(adapter: Adapter, spec: Scheme) -> list[str]:
    """The mechanisms (adapters.base.MECHANISMS) a score bias needs: the biased attention, or the mask of a
    family whose attention adds its mask outside ALL_ATTENTION_FUNCTIONS."""
    return slot_needs(adapter) + rotary_off(adapter) + ["score_mask" if adapter.blocks.score_mask else "score", "kwargs"]


class BiasMask(PatchHook):
    """Forward pre-hook on an attention module that adds the `attention_mask` it is handed to its scaled
    logits: the mask becomes `position_mask` of it and the scheme's bias for this call's positions (added
    once, nothing masked unmasked, one mask per forward shared by the layers), in the hidden states' dtype."""

    def __init__(self, causal: bool) -> None:
        self.causal = causal

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        kwargs = dict(kwargs)
        positions, bias = kwargs.pop(POSITIONS_KWARG, None), kwargs.pop(BIAS_KWARG, None)
        if positions is None or bias is None:
            raise PosEncError("score bias missing: a patched attention module was called outside its model")
        if MASK_ARGUMENT not in kwargs:
            raise PosEncError(f"{type(attention).__name__} was called without `{MASK_ARGUMENT}` as a keyword; "
                              "the score bias has no mask to go into")
        hidden = args[0] if args else kwargs["hidden_states"]
        mask: torch.Tensor | None = kwargs[MASK_ARGUMENT]
        kv_length = mask.shape[-1] if mask is not None else positions.keys.shape[-1]
        kwargs[MASK_ARGUMENT] = position_mask(positions, mask, bias, self.causal, hidden.shape[1], kv_length,
                                              hidden.dtype, hidden.device)
        return args, kwargs


def install_mask_bias(model: nn.Module, entry: Entry, state: PatchState, loop: LayerLoop) -> None:
    """The bias module on the base model; a `BiasMask` on every attention module takes it and the positions."""
    implementation_for(compat.attn_implementation(model.config))  # flash attention takes no float mask
    remove_native_positions(model, entry, state)
    add_scheme_module(BIAS_MODULE, BIAS_KWARG, model, entry, state, loop)
    for attention in entry.adapter.attention_modules(model):
        attention.register_forward_pre_hook(BiasMask(entry.adapter.causal), with_kwargs=True)


def install(model: nn.Module, entry: Entry, state: PatchState, loop: LayerLoop) -> None:
    if entry.adapter.blocks.score_mask:
        install_mask_bias(model, entry, state, loop)
    else:
        install_biased_attention(BIAS_MODULE, BIAS_KWARG, model, entry, state, loop)
