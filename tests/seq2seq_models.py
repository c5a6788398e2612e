"""Tiny random encoder-decoder models (no downloads) for the seq2seq rows: one config per family, peaky
weights (init std >= 0.15) so a wrong position moves logits by O(1), dropout off."""

from __future__ import annotations

from typing import Any, Callable

import torch
import transformers

BART_LIKE = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128, max_position_embeddings=64, init_std=0.2,
                 dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1,
                 eos_token_id=2, decoder_start_token_id=1)

# model_type -> (config factory, model class); T5's initializer_factor 3 gives weights of std >= 0.15
SEQ2SEQ: dict[str, tuple[Callable[[], Any], type]] = {
    "t5": (lambda: transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=128,
                                         initializer_factor=3.0, dropout_rate=0.0, relative_attention_num_buckets=8,
                                         relative_attention_max_distance=20, pad_token_id=0, eos_token_id=2,
                                         decoder_start_token_id=0),
           transformers.T5ForConditionalGeneration),
    "bart": (lambda: transformers.BartConfig(**BART_LIKE), transformers.BartForConditionalGeneration),
    "mbart": (lambda: transformers.MBartConfig(**BART_LIKE), transformers.MBartForConditionalGeneration),
    "marian": (lambda: transformers.MarianConfig(**{**BART_LIKE, "decoder_vocab_size": 128}),
               transformers.MarianMTModel),
    "pegasus": (lambda: transformers.PegasusConfig(**BART_LIKE), transformers.PegasusForConditionalGeneration),
    # M2M100 counts positions from padding_idx + 1 (its real pad id is 1)
    "m2m_100": (lambda: transformers.M2M100Config(**{**BART_LIKE, "pad_token_id": 1, "bos_token_id": 0}),
                transformers.M2M100ForConditionalGeneration),
    "whisper": (lambda: transformers.WhisperConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128, num_mel_bins=8, max_source_positions=16,
        max_target_positions=64, init_std=0.2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, begin_suppress_tokens=None,
        suppress_tokens=None), transformers.WhisperForConditionalGeneration),
}
# the scheme each family is pretrained with, as hf-posenc names it (own scheme == stock)
OWN = {"t5": "t5", "bart": "learned", "mbart": "learned", "marian": "sinusoidal", "pegasus": "sinusoidal",
       "m2m_100": "sinusoidal", "whisper": "learned"}


def tiny_seq2seq(model_type: str, attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config_fn, cls = SEQ2SEQ[model_type]
    return cls._from_config(config_fn(), attn_implementation=attn).eval()


def encoder_inputs(model: torch.nn.Module, batch: int = 2, length: int = 10, seed: int = 1) -> dict[str, torch.Tensor]:
    """Token ids for text encoders, log-mel frames for Whisper's audio encoder."""
    g = torch.Generator().manual_seed(seed)
    if model.config.model_type == "whisper":
        frames = 2 * model.config.max_source_positions
        return {"input_features": torch.randn(batch, model.config.num_mel_bins, frames, generator=g)}
    return {"input_ids": torch.randint(3, 120, (batch, length), generator=g)}
