"""A tiny decoder to train from scratch on the length-generalisation tasks of Kazemnejad et al. (2023), offline.

The length study's model (`benchmarks/lengthgen`: GPT-2-shaped, 2 layers of width 64, 4 heads, exact GELU, no
dropout) with the tasks' word tokenizer, and one task's prompt -> completion rows as a saved dataset: what
`recipes/lengthgen` train with any scheme (the recipe's `scheme` replaces GPT-2's learned table) before
`hf-posenc eval --suite lengthgen:TASK` scores them past the training lengths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import datasets
import torch
import transformers

from .errors import PosEncError
from .evaluation.lengthgen import tasks
from .evaluation.lengthgen.vocab import build_tokenizer

SHAPE = dict(n_embd=64, n_layer=2, n_head=4, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
             attn_pdrop=0.0)


def tiny_model(longest: int, seed: int = 0, *, positions: int | None = None, tokenizer: Any = None,
               **shape: Any) -> transformers.GPT2LMHeadModel:
    """A randomly initialised tiny GPT-2 whose learned table holds a task sequence of `longest` symbols (`n`
    symbols, `>`, `n` symbols, `.`), as the study sizes it, or `positions` rows; its vocabulary `tokenizer`'s
    (default: the tasks' own); `shape` overrides `SHAPE`'s GPT-2 config fields (the study's `--layers`-style
    settings)."""
    unknown = set(shape) - set(SHAPE)
    if unknown:
        raise PosEncError(f"unknown tiny decoder field(s) {sorted(unknown)}; allowed: {sorted(SHAPE)}")
    tokenizer = tokenizer or build_tokenizer()
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=positions or 2 * longest + 2,
                                     **{**SHAPE, **shape}, bos_token_id=tokenizer.eos_token_id,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(config)


def write_task(out: str | Path, task: str, train_lengths: Sequence[int], longest: int, n_train: int = 20_000,
               n_eval: int = 200, seed: int = 0) -> dict[str, Path]:
    """Save a tiny decoder with its tokenizer to `out/model` and the task's rows to `out/data` (train and validation
    splits, columns `prompt` and `completion`, spread evenly over `train_lengths`; the validation prompts kept out
    of training where a length has room); returns both paths.

    Args:
        task: repeat, copy, reverse or sort (`hf_posenc.evaluation.lengthgen.tasks`).
        longest: the longest input the model will be scored on (its learned table's reach).
    """
    out, lengths = Path(out), list(train_lengths)
    tasks.task_of(task)
    if not lengths or min(lengths) < 1:
        raise PosEncError(f"train_lengths must be positive symbol counts, got {lengths}")
    if longest < max(lengths):
        raise PosEncError(f"longest ({longest}) must be at least the longest train length ({max(lengths)})")
    train = tasks.draw(task, lengths, -(-n_train // len(lengths)), seed)[:n_train]
    held_out = tasks.draw(task, lengths, -(-n_eval // len(lengths)), seed + 10_000,
                          frozenset(e.prompt for e in train))[:n_eval]

    def rows(examples: list[tasks.Example]) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"prompt": [e.prompt for e in examples],
                                           "completion": [e.target for e in examples]})

    paths = {"model": out / "model", "data": out / "data"}
    tiny_model(longest, seed).save_pretrained(paths["model"])
    build_tokenizer().save_pretrained(paths["model"])
    datasets.DatasetDict({"train": rows(train), "validation": rows(held_out)}).save_to_disk(str(paths["data"]))
    return paths
