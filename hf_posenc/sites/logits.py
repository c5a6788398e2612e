"""Logits site (schemes of site "attention": self_extend, xpos): the scheme computes the q.k logits itself
from unrotated q and k and the positions of both, inside the posenc attention function (keys enter the
cache unrotated). The module lives on the layer loop's module (the base model, OPT's decoder) as
`posenc_attention`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ..attention import LOGITS_KWARG
from .base import LayerLoop, install_biased_attention
from .entry import Entry, rotary_off, slot_needs

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..schemes.base import Scheme
    from ..state import PatchState

LOGITS_MODULE = "posenc_attention"
PROBE = ("alibi", {})  # the scheme standing for this site in the self-check's "takes effect"


def needs(adapter: Adapter, spec: Scheme) -> list[str]:
    """The mechanisms (adapters.base.MECHANISMS) logits computed by the scheme need: the biased attention."""
    return slot_needs(adapter) + rotary_off(adapter) + ["score", "kwargs"]


def install(model: nn.Module, entry: Entry, state: PatchState, loop: LayerLoop) -> None:
    install_biased_attention(LOGITS_MODULE, LOGITS_KWARG, model, entry, state, loop)
