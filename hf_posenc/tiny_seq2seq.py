"""Tiny encoder-decoders to train from scratch on the length-generalisation tasks, offline.

A T5 or a BART built from a config (random init, no download) with a digit tokenizer, and a task's input ->
output pairs (`data.seq2seq_pairs`) as a saved dataset: what `recipes/t5-tiny` and `recipes/bart-tiny` train
and `benchmarks/seq2seq_lengthgen.py` compares across schemes (short training lengths, tested up to 4x).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any, Sequence

import datasets
import torch
import transformers

from .data import seq2seq_pairs
from .errors import PosEncError

SPECIALS = ("<pad>", "</s>", "<unk>", "<s>")  # ids 0..3; every encoded row ends with </s>
SYMBOLS = (*string.digits, "+")
_SHARED = dict(vocab_size=len(SPECIALS) + len(SYMBOLS), pad_token_id=0, eos_token_id=1)
# model_type -> (config class, fields): 2 + 2 layers of width 128, no dropout (a few minutes of CPU learn a task)
CONFIGS: dict[str, tuple[type, dict[str, Any]]] = {
    "t5": (transformers.T5Config, dict(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2, num_heads=4,
                                       dropout_rate=0.0, feed_forward_proj="relu", decoder_start_token_id=0, **_SHARED)),
    # BART's learned table must cover the longest test input (+2: its offset)
    "bart": (transformers.BartConfig, dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                           decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                                           max_position_embeddings=256, dropout=0.0, attention_dropout=0.0,
                                           activation_dropout=0.0, bos_token_id=3, decoder_start_token_id=3,
                                           forced_eos_token_id=None, **_SHARED)),
}


def digit_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """One token per digit and per "+", whitespace ignored, `</s>` appended to every row (so a target
    tells the decoder where to stop); decoding joins tokens with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate((*SPECIALS, *SYMBOLS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>", bos_token="<s>")


def tiny_model(model_type: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A randomly initialised tiny T5 or BART (`CONFIGS`), with the transformers init of its family."""
    if model_type not in CONFIGS:
        raise PosEncError(f"no tiny seq2seq config for {model_type!r}; choose one of {', '.join(CONFIGS)}")
    config_cls, fields = CONFIGS[model_type]
    torch.manual_seed(seed)
    return transformers.AutoModelForSeq2SeqLM.from_config(config_cls(**fields))


def write_task(out: str | Path, model_type: str, task: str, train_lengths: Sequence[int], n_train: int = 20_000,
               n_eval: int = 200, seed: int = 0) -> dict[str, Path]:
    """Save a tiny model with its tokenizer to `out/model` and the task's pairs to `out/data` (train and
    validation splits, lengths drawn uniformly from `train_lengths`); returns both paths.

    Args:
        task: copy, reverse or addition (`data.SYNTHETIC_TASKS`).
        train_lengths: the digit counts trained on (the recipe tests longer ones).
        n_train, n_eval: pairs per split, spread evenly over the lengths.
    """
    out = Path(out)
    lengths = list(train_lengths)
    if not lengths or min(lengths) < 1:
        raise PosEncError(f"train_lengths must be positive digit counts, got {lengths}")

    def split(n: int, offset: int) -> datasets.Dataset:
        parts = [seq2seq_pairs(task, length, -(-n // len(lengths)), seed + offset) for length in lengths]
        return datasets.concatenate_datasets(parts).shuffle(seed=seed)

    paths = {"model": out / "model", "data": out / "data"}
    model = tiny_model(model_type, seed)
    model.save_pretrained(paths["model"])
    digit_tokenizer().save_pretrained(paths["model"])
    # seeds offset past the eval suites' (`--seed`, default 0): their test pairs are never training pairs
    datasets.DatasetDict({"train": split(n_train, 100_000), "validation": split(n_eval, 200_000)}).save_to_disk(
        paths["data"])
    return paths
