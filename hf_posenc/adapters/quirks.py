"""What the generic adapter cannot read from a model instance, as data by model type (found by
the zoo sweep, checked by tests/test_zoo.py). Everything else is discovered."""

from __future__ import annotations

from typing import Any

from torch import nn

# How a packed projection orders q, k, v (from each modeling file): "grouped" is [q | k | v] with
# q = heads*head_dim and k, v = kv_heads*head_dim wide; "per_head" is [q_h | k_h | v_h] per head
# (GPT-NeoX, BLOOM); "kv_groups" is per key-value group [q_1..q_g | k | v] (Falcon's new decoder).
# A config flag can select the layout (first flag set wins, "" is the default).
PACKED_LAYOUTS: dict[str, str | dict[str, str]] = {
    "gpt2": "grouped",
    "gpt-sw3": "grouped",
    "openai-gpt": "grouped",
    "gpt_bigcode": "grouped",
    "phi3": "grouped",
    "phi4_multimodal": "grouped",
    "dbrx": "grouped",
    "mpt": "grouped",
    "gpt_neox": "per_head",
    "gpt_neox_japanese": "per_head",
    "persimmon": "per_head",
    "fuyu": "per_head",
    "bloom": "per_head",
    "falcon": {"new_decoder_architecture": "kv_groups", "multi_query": "grouped", "": "per_head"},
    "codegen": "codegen_blocks",  # q, v, k interleaved in mp_num blocks
}
# Gaps no structure shows (found by the zoo sweep), by model type.
KNOWN_GAPS: dict[str, dict[str, str]] = {
    "big_bird": {"qk_tap": "BigBird swaps its attention module for a new one (set_attention_type) when a sequence is "
                           "too short for block-sparse attention; hooks on the old module stop running"},
    "doge": {"score": "Doge adds its own dynamic mask of shape (B, kv_heads, q, k) to the attention mask, which a "
                      "(B, heads, q, k) bias does not broadcast with"},
    "lfm3": {"rotary_off": "the model reads `rotary_emb.layer_types`, which a substitute rotation does not have"},
    "zaya": {m: "ZAYA's CCA attention does not take its rotation from rotary_emb: replacing it changes nothing "
                "(the zoo sweep: `nope` had no effect)" for m in ("rope_config", "rotary_off")},
    "laguna": {"score": "heads are set per layer (num_attention_heads_per_layer); biases are built for "
                        "config.num_attention_heads"},
    "led": {"slot_code": "LED's encoder pads its input to a multiple of attention_window before it reads positions "
                         "(embed_positions(padded shape)): a code of the layer loop's positions has fewer of them "
                         "(the seq2seq sweep: input and native fail)"},
    "bigbird_pegasus": {"score": "its decoder self-attention is built with is_causal=False and the sdpa mask "
                                 "function posenc_* attention uses skips a plain causal mask, so the bias would "
                                 "run without causality (the zoo sweep: cache-score fails)"},
    "fuyu": {"input": "FuyuModel hands the language model position ids counted from 0 whatever the padding, which "
                      "the layer loop honours as explicit ids: an absolute code would not follow left padding (the "
                      "zoo sweep: left_padding-input fails)"},
    "got_ocr2": {"score": "its language model runs sdpa under a top config saying eager: posenc attention is set for "
                          "all sub-models and unpatch puts back eager everywhere, so logits are not bit-identical "
                          "(the zoo sweep: patch_unpatch-score fails)"},
}
# Families whose config names no max_position_embeddings: the length they were trained at, which sizes
# input-site tables (option `max_positions` overrides it). BLOOM: 2048 tokens (BigScience, arXiv 2211.05100).
# The T5 family names no maximum (its bias buckets reach any length): T5 512-token inputs (Raffel et al. 2020,
# sec. 3.1.2), mT5 1024 (Xue et al. 2021, sec. 3), LongT5 4096 (Guo et al. 2022, sec. 3), Switch Transformers
# T5's 512 (Fedus et al. 2022 pre-train with T5's setup). Not known: UMT5, Pop2Piano (MIDI tokens).
TRAINED_LENGTHS = {"bloom": 2048, "t5": 512, "mt5": 1024, "longt5": 4096, "switch_transformers": 512}
# Configs that name the width of a head otherwise than head_dim: T5's attribute_map aliases head_dim to d_kv,
# these T5 variants' do not (and d_kv need not be d_model / heads).
HEAD_DIM_FIELDS = {"switch_transformers": "d_kv", "pop2piano": "d_kv"}
# Config fields that size the position table, where it is not max_position_embeddings, by model type and stack
# of an encoder-decoder model ("": any): the text decoders of Whisper, Speech2Text and SpeechT5 (their
# max_source_positions / max_speech_positions are the audio encoder's), LED's two tables.
POSITIONS_FIELDS: dict[str, dict[str, str]] = {
    "whisper": {"": "max_target_positions"},
    "speech_to_text": {"": "max_target_positions"},
    "speecht5": {"": "max_text_positions"},
    "led": {"encoder": "max_encoder_position_embeddings", "decoder": "max_decoder_position_embeddings"},
}
# Attention modules outside ALL_ATTENTION_FUNCTIONS that add the `attention_mask` keyword they are handed to
# their scaled logits (read in each modeling file: BLOOM after `alibi.baddbmm`, Falcon in sdpa and both eager
# branches): the score site puts the scheme's bias into that mask.
MASK_ADDED_TO_LOGITS = frozenset({"bloom", "falcon"})
# A base-model attribute that switches the native bias on, where a zero bias argument would not reach it:
# Falcon folds ALiBi into the mask before the blocks (up to transformers 5.24 it also hands it to each block as
# `alibi`, from 5.25 on only the mask carries it).
NATIVE_BIAS_SWITCHES = {"falcon": "use_alibi"}
# A config flag that turns the attention's rotation off where the attention's own code reads it: from 5.25 on an
# ALiBi Falcon never rotates (`if not self.config.alibi`), so its rotary module is inert and RoPE schemes rotate
# q and k at the projection; up to 5.24 it rotated whenever its `alibi` argument was None (the switch above off).
ROTATION_OFF_FLAGS = {"falcon": "alibi"}
# Native ALiBi slopes are the standard ones times head_dim**power: Falcon divides its bias by sqrt(head_dim).
ALIBI_HEAD_DIM_POWER = {"falcon": -0.5}
# Configs that carry default rope_parameters but rotate only when this field has this value.
ROPE_SWITCHES = {"granitemoehybrid": ("position_embedding_type", "rope"), "zamba2": ("use_mem_rope", True)}


def packed_layout(model_type: str, attention: nn.Module) -> str | None:
    layout = PACKED_LAYOUTS.get(model_type)
    if isinstance(layout, dict):
        config = getattr(attention, "config", None)
        return next((v for flag, v in layout.items() if flag and getattr(config, flag, False)), layout.get(""))
    return layout


def positions_field(model_type: str, stack: str | None = None) -> str:
    """The config field sizing the position table of `model_type` (of one stack of an encoder-decoder model)."""
    fields = POSITIONS_FIELDS.get(model_type, {})
    return fields.get(stack or "", fields.get("", "max_position_embeddings"))


def head_dim(config: Any) -> int | None:
    """The config's width of one attention head, None if it names none (then hidden_size / heads)."""
    return getattr(config, HEAD_DIM_FIELDS.get(getattr(config, "model_type", ""), "head_dim"), None)
