"""The tasks' own tokenizer: one token per word (the ten symbols, `>`, `.`) and the special tokens, built as a
transformers `PreTrainedTokenizerFast` so `save_pretrained` / `from_pretrained` and the recipe runner take it; and
the check that any tokenizer spells the task's words (a pretrained one prompted in-context too)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ...errors import PosEncError
from .tasks import END, SEPARATOR, SYMBOLS

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
WORDS = (*SYMBOLS, SEPARATOR, END)


def build_tokenizer(words: Sequence[str] = WORDS) -> PreTrainedTokenizerFast:
    """Word-level over `words` (the tasks' own by default), split on whitespace, decoded with spaces between words
    (so a decoded answer reads as the target does); padding on the right, no special token added around the text."""
    vocab = {word: i for i, word in enumerate((PAD, EOS, UNK, *words))}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=EOS,
                                   unk_token=UNK, padding_side="right",
                                   clean_up_tokenization_spaces=False)


def check_tokenizer(tokenizer: Any) -> None:
    """A tokenizer that cannot spell every word of the tasks (an unknown token, or text that does not decode
    back) is refused, naming the words."""
    unk = getattr(tokenizer, "unk_token_id", None)
    bad = []
    for word in WORDS:
        ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        if not ids or (unk is not None and unk in ids) or tokenizer.decode(ids).strip() != word:
            bad.append(word)
    if bad:
        raise PosEncError(f"the tokenizer cannot spell the task words {' '.join(bad)} (each must encode without "
                          f"an unknown token and decode back); the tasks use {' '.join(WORDS)}")
