"""transformers' attention and mask interfaces: the implementation a config names, the functions behind a name,
registering the patch's own."""

from __future__ import annotations

from typing import Callable

from transformers import PretrainedConfig
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

def attn_implementation(config: PretrainedConfig) -> str:
    return config._attn_implementation


def known_attention(name: str) -> bool:
    """Whether transformers knows `name` as an attention implementation (eager is each model's own)."""
    return name == "eager" or name in ALL_ATTENTION_FUNCTIONS


def base_attention_function(name: str) -> Callable | None:
    """The stock attention function registered under `name` (None for 'eager', which is per model)."""
    if name == "eager":
        return None
    return ALL_ATTENTION_FUNCTIONS[name]


def base_mask_function(name: str) -> Callable:
    return ALL_MASK_ATTENTION_FUNCTIONS[name]


def register_attention(name: str, attention: Callable, mask: Callable) -> None:
    """Register under a new implementation name with BOTH interfaces.

    With only the attention interface registered, transformers builds no mask at all and
    padding is silently ignored (seen on 5.x).
    """
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)
