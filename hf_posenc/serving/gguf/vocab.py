"""A tokenizer as llama.cpp's converter writes it (`_set_vocab_gpt2`): byte-level BPE tokens with their types,
the merges, the pre-tokenizer's name, the special ids and the chat template. A tokenizer of another kind, or a
byte-level BPE whose pre-tokenization no llama.cpp pre-tokenizer repeats, is refused before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...errors import PosEncError

__all__ = ["PRE_TOKENIZERS", "Vocab", "read_vocab"]


def _kinds(pre: dict[str, Any] | None) -> tuple[str, ...]:
    """A tokenizer.json pre_tokenizer as a tuple of its steps: type and what changes the splits."""
    if pre is None:
        return ()
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    out = []
    for step in steps:
        if step["type"] == "Digits":
            out.append(f"Digits(individual={step.get('individual_digits', False)})")
        elif step["type"] == "ByteLevel":
            out.append(f"ByteLevel(regex={step.get('use_regex', True)}, prefix={step.get('add_prefix_space', False)})")
        elif step["type"] == "Split":
            out.append(f"Split({(step.get('pattern') or {}).get('Regex') or (step.get('pattern') or {}).get('String')})")
        else:
            out.append(step["type"])
    return tuple(out)


# tokenizer.json pre-tokenization -> llama.cpp's pre-tokenizer of the same splits (llama-vocab.cpp)
PRE_TOKENIZERS: dict[tuple[str, ...], str] = {
    ("ByteLevel(regex=True, prefix=False)",): "gpt-2",
    ("Digits(individual=True)", "ByteLevel(regex=True, prefix=False)"): "smollm",
}


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    special: dict[str, int]
    add_bos: bool
    chat_template: str | None


def read_vocab(tokenizer: Any, vocab_size: int) -> Vocab:
    """The GGUF vocabulary of a transformers fast tokenizer, padded to the model's vocab_size as the converter pads
    it; PosEncError naming what llama.cpp cannot represent."""
    from gguf import TokenType

    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else {}
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or (spec.get("decoder") or {}).get("type") != "ByteLevel":
        raise PosEncError(f"cannot export the tokenizer to GGUF: a {model.get('type', type(tokenizer).__name__)} "
                          "tokenizer; hf-posenc writes byte-level BPE (GPT-2 style) tokenizers, as llama.cpp's "
                          "'gpt2' vocabulary; nothing was written")
    steps = _kinds(spec.get("pre_tokenizer"))
    if steps not in PRE_TOKENIZERS:
        raise PosEncError(f"cannot export the tokenizer to GGUF: its pre-tokenization {' + '.join(steps) or 'none'} "
                          f"is none of llama.cpp's known ones ({'; '.join(' + '.join(k) for k in PRE_TOKENIZERS)}); "
                          "nothing was written")
    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    added = {i: t for i, t in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    special = {name: i for name in ("bos", "eos", "unk", "pad")
               if isinstance(i := getattr(tokenizer, f"{name}_token_id", None), int) and 0 <= i < vocab_size}
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return Vocab(tokens, [int(t) for t in types], merges, PRE_TOKENIZERS[steps], special,
                 bool(getattr(tokenizer, "add_bos_token", False)), template)
