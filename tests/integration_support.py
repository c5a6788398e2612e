"""For the integration tests (lm-eval, TRL): a tiny tokenizer, saved tiny models, and the docs' code."""

from __future__ import annotations

import re
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import tiny_model
from hf_posenc.integrations.lora import modules_to_save

DOC = Path(__file__).resolve().parents[1] / "docs" / "with_other_tools.md"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (99 ids, inside the tiny models' 128), with pad and an eos that lm-eval
    uses as the prefix of a rolling window and TRL appends to every example."""
    chars = ["<pad>", "<unk>", "<eos>", *string.printable[:-5], "\n"]
    backend = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")


def save_tiny(folder: Path, model_type: str = "llama", model: torch.nn.Module | None = None) -> Path:
    """Save a tiny random model (or `model`) with the character tokenizer, as a user's folder would be."""
    (model if model is not None else tiny_model(model_type)).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def randomize_scheme_weights(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Move the patch's own weights far from their init: zero-initialised biases (t5, fire) or a table
    copied from the model would let a dropped or misplaced weight go unnoticed."""
    modules = dict(model.named_modules())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in modules_to_save(model):
            for param in modules[name].parameters():
                param.copy_(torch.randn(param.shape, generator=generator))
    return model


def doc_blocks(section: str, language: str, doc: Path = DOC) -> list[str]:
    """The fenced `language` blocks of one `## section` of a docs page (docs/with_other_tools.md by default)."""
    text = doc.read_text(encoding="utf-8")
    body = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert body, f"{doc} has no section {section!r}"
    return re.findall(rf"^```{language}\n(.*?)^```", body.group(1), re.M | re.S)


def doc_commands(section: str) -> list[str]:
    """The shell commands of a section, continuation lines joined, installs left out."""
    lines = "\n".join(doc_blocks(section, "shell")).replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("pip ")]
