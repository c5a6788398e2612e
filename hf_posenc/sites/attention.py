"""Attention site (self_extend, xpos): the scheme computes the q.k logits itself from unrotated q and k
and the positions of both, inside the posenc attention function (keys enter the cache unrotated)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ..attention import LOGITS_KWARG
from ..schemes.base import ModelFacts, Scheme
from .base import LayerLoop, install_biased_attention

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..patching import PatchState

LOGITS_MODULE = "posenc_attention"


def install(model: nn.Module, adapter: Adapter, spec: Scheme, facts: ModelFacts, state: PatchState,
            loop: LayerLoop) -> None:
    logits = spec.module(state.config.options, facts)
    install_biased_attention(model, adapter, logits, LOGITS_MODULE, LOGITS_KWARG, facts, state, loop)
