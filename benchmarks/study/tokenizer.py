"""A byte-level BPE trained on the study's own training text (`tokenizers`), so a small model's
embedding is not dominated by a large vocabulary built for other text."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def train_bpe(text: str, vocab: int, out: Path) -> PreTrainedTokenizerFast:
    """Train on `text` (the training part only: the held-out tail must not shape the vocabulary), save to `out`."""
    if (out / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(out)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(text.splitlines(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, pad_token=EOS)
    tokenizer.save_pretrained(out)
    return tokenizer
