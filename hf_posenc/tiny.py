"""A tiny random model of any transformers config class: what the zoo sweep, the release self-check and
`hf-posenc doctor` build.

One generic shrink of the class's default config (hidden 64, 2 layers, 4 heads, ...) applied only to the
keys a config actually has, recursively through its sub-configs, plus per-model-type overrides kept as
data in `tiny_overrides.json`. Weights are drawn with `initializer_range` >= 0.2 so that attention is
peaky and a wrong position changes logits by O(1), not 1e-4.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig

# per model type: fields a generic shrink cannot guess (keys starting with "_" are build steps, e.g. `_call`)
OVERRIDES: dict[str, dict[str, Any]] = json.loads(Path(__file__).with_name("tiny_overrides.json").read_text())

VOCAB = 128
SPECIAL_IDS = 3  # 0 pad, 1 bos, 2 eos; other special tokens (images, audio, ...) live at the top
FIRST_EXTRA_TOKEN = 120  # test inputs use ids in [SPECIAL_IDS, FIRST_EXTRA_TOKEN)
INIT_STD = 0.2

# key -> tiny value, applied wherever a (sub-)config has the key
SHRINK: dict[str, Any] = {
    # width and depth
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64, "embed_dim": 64, "model_dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
    "encoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "num_key_value_heads": 2, "n_kv_heads": 2, "num_kv_heads": 2, "multi_query_group_num": 2,
    "head_dim": 16, "kv_channels": 16, "attention_head_dim": 16,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "ffn_hidden_size": 128, "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128, "hidden_dim": 128, "mlp_dim": 128, "d_ff": 128,
    "vocab_size": VOCAB, "max_position_embeddings": 128, "n_positions": 128, "max_sequence_length": 128,
    "seq_length": 128, "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16,
    "pronunciation_vocab_size": 32, "shape_vocab_size": 32,
    # mixtures of experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "moe_k": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "n_shared_experts": 1,
    "num_shared_experts": 1, "expert_intermediate_size": 32, "moe_ffn_hidden_size": 32,
    "n_group": 1, "topk_group": 1,
    # multi-head latent attention
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    # state-space and linear-attention mixers of hybrid models
    "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_ssm": 128, "mamba_d_state": 16, "mamba_chunk_size": 16,
    "mamba_num_heads": 4, "mamba_head_dim": 32, "ssm_state_size": 16, "chunk_size": 16,
    "linear_num_heads": 4, "linear_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    # BERT-style models are causal LMs only as decoders
    "is_decoder": True,
    # local attention
    "sliding_window": 16, "attention_window_size": 16,
    # partial rotary given as a width
    "rotary_dim": 8,
}
# fields holding vocabulary ids that must stay inside the tiny vocabulary
LOW_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
              "sep_token_id": 2, "cls_token_id": 1, "mask_token_id": FIRST_EXTRA_TOKEN}


def _is_token_field(key: str) -> bool:
    return key.endswith(("_token_id", "_token_index", "_token_ids"))


LAYER_COUNT_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
LAYER_PATTERN_KEYS = ("layer_types", "layers_block_type", "block_types", "attention_layers")


def _shrink_layer_lists(values: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """One layer of each distinct layer type (attention kinds, mamba/attention hybrids), in the
    order they first appear; other per-layer lists keep their first entries."""
    depth = next((values[k] for k in LAYER_COUNT_KEYS if isinstance(values.get(k), int)), None)
    kinds = {k: list(dict.fromkeys(map(str, values[k]))) for k in LAYER_PATTERN_KEYS
             if isinstance(values.get(k), list) and values[k]}
    layers = max([2, *map(len, kinds.values())])
    for key in LAYER_COUNT_KEYS:
        if key in kwargs:
            kwargs[key] = layers
    for key, names in kinds.items():
        kwargs[key] = (names * layers)[:layers]
    for key, value in values.items():
        if key not in kinds and key not in kwargs and isinstance(value, list) and depth and len(value) == depth:
            kwargs[key] = value[:layers]


def _shrunk(default: transformers.PretrainedConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments that build a tiny version of `default`'s config class."""
    values = default.to_dict()
    known = set(values) | set(getattr(default, "attribute_map", {}))
    if dataclasses.is_dataclass(default):  # a value the config derives from its fields is left to derive (Falcon's
        known &= {f.name for f in dataclasses.fields(default)} | set(getattr(default, "attribute_map", {}))  # kv heads)
    kwargs: dict[str, Any] = {k: v for k, v in SHRINK.items() if k in known}
    if "qk_rope_head_dim" in known:  # multi-head latent attention: head_dim is the rotary part, no GQA
        kwargs["head_dim"] = SHRINK["qk_rope_head_dim"]
        kwargs["num_key_value_heads"] = SHRINK["num_attention_heads"]
    if "initializer_range" in known:
        kwargs["initializer_range"] = max(INIT_STD, values.get("initializer_range") or 0.0)
    extra = iter(range(FIRST_EXTRA_TOKEN + 1, VOCAB))
    for key, value in values.items():
        if _is_token_field(key) and isinstance(value, int) and not isinstance(value, bool):
            kwargs[key] = LOW_TOKENS.get(key, value if value < SPECIAL_IDS else next(extra, VOCAB - 1))
        elif _is_token_field(key) and isinstance(value, list):
            kwargs[key] = [LOW_TOKENS.get(key, 2)]
    _shrink_layer_lists(values, kwargs)
    for name, sub in (getattr(default, "sub_configs", None) or {}).items():
        sub_default = getattr(default, name, None)
        if isinstance(sub_default, transformers.PretrainedConfig):
            kwargs[name] = {**_shrunk(sub_default, overrides.get(name, {})), "model_type": sub_default.model_type}
    kwargs.update({k: v for k, v in overrides.items() if not isinstance(v, dict) or k not in kwargs})
    return kwargs


def tiny_config(model_type: str) -> transformers.PretrainedConfig:
    """The config class of `model_type`, shrunk: hidden 64, 2 layers (one of each layer kind), 4 heads, vocab 128."""
    overrides = {k: v for k, v in OVERRIDES.get(model_type, {}).items() if not k.startswith("_")}
    try:
        default = AutoConfig.for_model(model_type)
    except ValueError:  # a few default configs do not validate as they are; their overrides fix them
        default = AutoConfig.for_model(model_type, **overrides)
    return AutoConfig.for_model(model_type, **_shrunk(default, overrides))


def tiny_model(model_type: str, model_class: Any, seed: int = 0, attn: str | None = None) -> torch.nn.Module:
    """A fresh tiny random `model_class` (an Auto class or a model class) of `model_type`, in eval mode."""
    model = build(tiny_config(model_type), model_class, seed, attn)
    for method, *args in OVERRIDES.get(model_type, {}).get("_call", []):  # e.g. X-MOD's default language
        getattr(model, method)(*args)
    return model


def build(config: transformers.PretrainedConfig, model_class: Any, seed: int = 0, attn: str | None = None,
          dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random `model_class` (an Auto class or a model class) of `config` drawn from `seed`, in eval mode. In
    another `dtype` it has the fp32 model's weights, as `from_pretrained(dtype=...)` loads them: parameters in
    `dtype`, buffers as the model computes them (rotary frequencies stay fp32)."""
    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {"attn_implementation": attn} if attn else {}
    make = getattr(model_class, "from_config", None) or model_class._from_config
    model = make(config, **kwargs)
    if dtype != torch.float32:
        with torch.random.fork_rng():  # a patch after this draws what it draws after the fp32 model
            loaded = make(config, **kwargs, dtype=dtype)
        loaded.load_state_dict(model.state_dict())
        model = loaded
    return model.eval()


def tiny_ids(batch: int = 2, length: int = 12, seed: int = 1) -> torch.Tensor:
    """Token ids of ordinary tokens of the tiny vocabulary (no special ones)."""
    return torch.randint(SPECIAL_IDS, FIRST_EXTRA_TOKEN, (batch, length), generator=torch.Generator().manual_seed(seed))
