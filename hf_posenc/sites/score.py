"""Score site (alibi, t5, fire, kerple, untied): a bias on the attention logits.

The scheme's bias module lives on the base model as `posenc_bias`; the layer-loop hook hands it and the
positions of queries and keys to the posenc attention function, which adds the bias whatever mask arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ..attention import BIAS_KWARG
from ..schemes.base import ModelFacts, Scheme
from .base import LayerLoop, install_biased_attention

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..patching import PatchState

BIAS_MODULE = "posenc_bias"


def install(model: nn.Module, adapter: Adapter, spec: Scheme, facts: ModelFacts, state: PatchState,
            loop: LayerLoop) -> None:
    bias = spec.module(state.config.options, facts)
    install_biased_attention(model, adapter, bias, BIAS_MODULE, BIAS_KWARG, facts, state, loop)
