"""transformers' rotation: its reference rotary module, RoPE init functions and where a config keeps its
`rope_parameters` (the text config of a multimodal model, a head_dim it may not name)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

def rotary_module_class() -> type[torch.nn.Module]:
    """transformers' reference rotary module; its RoPE-type dispatch works for any config."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding


@torch.no_grad()
def rederive_rotary(module: torch.nn.Module) -> None:
    """Compute a transformers rotary module's frequencies again from its config, in place (its init does it; the
    model's `init_weights` does not on transformers 5.0, so a model built on the meta device had them empty)."""
    init = ROPE_INIT_FUNCTIONS.get(module.rope_type, module.compute_default_rope_parameters)
    inv_freq, _ = init(module.config)
    for name in ("inv_freq", "original_inv_freq"):
        if isinstance(getattr(module, name, None), torch.Tensor):
            getattr(module, name).copy_(inv_freq)


# The rope_parameters keys of transformers' common RoPE types; any other key is a model's own (GPT-OSS's
# `truncate`, Ministral 3's `llama_4_scaling_beta`) and stays when a patch writes new rope_parameters
# (`type` is the legacy name of `rope_type`).
ROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
             "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "low_freq_factor",
             "high_freq_factor", "short_factor", "long_factor"}


# What model code reads off its rotary module besides calling it: Ergo (5.25) iterates `rotary_emb.rope_type`, a dict
# by layer type, to ask for one rotation per type.
ROTARY_ATTRIBUTES = ("rope_type",)


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config holding the text decoder's settings: a sub-config in multimodal wrappers (Fuyu, GOT-OCR2)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def rope_parameters(config: PretrainedConfig) -> dict[str, Any] | None:
    """The model's own RoPE parameters (v5 `rope_parameters`), or None if it does not rotate."""
    params = getattr(config, "rope_parameters", None)
    return dict(params) if params else None


def rotary_config(
    *, head_dim: int, max_position_embeddings: int, rope_parameters: dict[str, Any]
) -> PretrainedConfig:
    """A minimal config that transformers' rotary module and ROPE_INIT_FUNCTIONS accept."""
    config = PretrainedConfig()
    config.head_dim = head_dim
    config.hidden_size = head_dim
    config.num_attention_heads = 1
    config.max_position_embeddings = max_position_embeddings
    config.rope_parameters = dict(rope_parameters)
    return config


def with_head_dim(config: PretrainedConfig) -> PretrainedConfig:
    """`config`, or a copy of it with head_dim = hidden_size // heads where it names none: Hub configs
    (Mixtral-8x7B's) omit it and some RoPE init functions (YaRN's) multiply it without the fallback."""
    if getattr(config, "head_dim", None) or not getattr(config, "num_attention_heads", None):
        return config
    config = copy.deepcopy(config)
    config.head_dim = config.hidden_size // config.num_attention_heads
    return config
