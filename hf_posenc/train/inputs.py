"""Data side of a recipe: load the source, check its columns, tokenize. A causal LM's packing, labels, completion-only
masking and padding are TRL's `SFTTrainer`'s, the other tasks' padding transformers' collators'; the order and sharding
are Trainer's."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator

import datasets
import pyarrow as pa
import torch
from datasets.table import InMemoryTable
from transformers import DataCollatorForSeq2Seq, DataCollatorWithPadding
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from ..errors import PosEncError
from .pose import PoseCollator
from .recipe import TASK_COLUMNS, Recipe

BUILTIN = ("kjv", "sentiment")  # dataset_name names of the offline built-ins (no paths)
ROW_BLOCKS = 1024  # blocks of a causal LM's row handed to TRL, which makes each row's labels in Python
IGNORE_INDEX = -100  # label positions the loss skips (transformers' and torch's cross-entropy default)
FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_raw(recipe: Recipe) -> datasets.DatasetDict:
    """The dataset named by `dataset_name`, as splits, with its columns checked against the recipe."""
    d, src = recipe.data, recipe.source
    name = d.dataset_name
    path = Path(name)
    try:
        if name == "kjv":
            from ..data import long_text

            raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict({d.text_column: [long_text("kjv")]})})
        elif name == "sentiment":
            from ..data import sentiment_dataset

            raw = sentiment_dataset()
        elif path.is_dir():
            raw = datasets.load_from_disk(str(path))
        elif path.suffix in FILE_BUILDERS and path.is_file():
            raw = datasets.load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path))
        else:
            raw = datasets.load_dataset(name, d.dataset_config)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise PosEncError(f"{src}: dataset_name: cannot load {name!r}: {err}") from None
    if isinstance(raw, datasets.Dataset):
        raw = datasets.DatasetDict({"train": raw})
    if d.dataset_train_split not in raw:
        raise PosEncError(f"{src}: dataset_train_split: {d.dataset_train_split!r} not in {name!r}; splits: {', '.join(raw)}")
    needed = TASK_COLUMNS[recipe.model.task]
    for split in [d.dataset_train_split] + ([d.dataset_test_split] if d.dataset_test_split in raw else []):
        for key in needed:
            column = getattr(d, key)
            if column not in raw[split].column_names:
                raise PosEncError(
                    f"{src}: {key}: column {column!r} not in {name!r} split {split!r}; "
                    f"columns: {', '.join(raw[split].column_names)}"
                )
    return raw


@dataclasses.dataclass
class Prepared:
    train: datasets.Dataset  # token rows: a causal LM's for TRL's SFTTrainer to pack, or the task's rows
    eval: datasets.Dataset
    eval_ids: torch.Tensor | None  # 1-D held-out token stream, for perplexity_by_length
    eval_raw: datasets.Dataset | None  # held-out rows as text, for the suite's classification metrics
    collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]] | None  # None: SFTTrainer's own collator
    eval_collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]] | None = None  # None: `collate`


def _token_stream(texts: list[str], tokenizer: Any) -> torch.Tensor:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    texts = [t for t in texts if t and not t.isspace()]  # e.g. wikitext's blank lines
    for row in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(row + eos)
    return torch.tensor(ids, dtype=torch.long)


def _stream(ids: torch.Tensor, seq_len: int, cap: int | None) -> datasets.Dataset:
    """The token stream cut to whole `seq_len` blocks (at most `cap`), as rows of up to `ROW_BLOCKS` blocks, straight
    from its array (a corpus is no list of Python ints): TRL's "wrapped" packing cuts them into exactly those blocks
    (its "bfd" would fit documents into rows instead)."""
    n = ids.numel() // seq_len
    n = min(n, cap) if cap else n
    ends = [*range(0, n * seq_len, ROW_BLOCKS * seq_len), n * seq_len]
    column = pa.ListArray.from_arrays(pa.array(ends, pa.int32()), pa.array(ids[: n * seq_len].numpy()))
    return datasets.Dataset(InMemoryTable(pa.table({"input_ids": column})))


def prepare_lm(recipe: Recipe, raw: datasets.DatasetDict, tokenizer: Any) -> Prepared:
    """Causal LM: the text as one token stream, which TRL packs into `seq_len` blocks (PoSE windows if asked)."""
    d = recipe.data
    train_ids = _token_stream(list(raw[d.dataset_train_split][d.text_column]), tokenizer)
    if d.dataset_test_split is not None and d.dataset_test_split in raw:
        eval_ids = _token_stream(list(raw[d.dataset_test_split][d.text_column]), tokenizer)
    else:  # hold out the tail: for one long document (kjv) the split stays contiguous
        cut = int(train_ids.numel() * (1 - d.eval_fraction))
        train_ids, eval_ids = train_ids[:cut], train_ids[cut:]
    if min(train_ids.numel(), eval_ids.numel()) < d.seq_len:
        raise PosEncError(
            f"{recipe.source}: seq_len: {d.seq_len} tokens is longer than the data "
            f"({train_ids.numel()} train / {eval_ids.numel()} eval tokens)"
        )
    train, evals = _stream(train_ids, d.seq_len, d.max_train_samples), _stream(eval_ids, d.seq_len, d.max_eval_samples)
    if (pose := recipe.posenc.pose) is None:
        return Prepared(train, evals, eval_ids, None, collate=None)
    # the held-out blocks keep plain positions (the collator sees training batches only): the model is scored as used
    collate = PoseCollator(pose.target_length, pose.chunks, recipe.training.seed, tokenizer.eos_token_id,
                           getattr(torch, recipe.model.dtype))  # the dtype the model is loaded in
    return Prepared(train, evals, eval_ids, None, collate=collate,
                    eval_collate=DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id))


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars (TRL's preparation maps the rows a few times, a bar each): the run's own bars
    say what it does, and output piped to a file stays quiet."""
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def row_splits(recipe: Recipe, raw: datasets.DatasetDict) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train rows, held-out rows capped at `max_eval_samples`): the eval split, or a seeded share of train."""
    d = recipe.data
    train_raw = raw[d.dataset_train_split]
    if d.dataset_test_split is not None and d.dataset_test_split in raw:
        eval_raw = raw[d.dataset_test_split]
    else:
        split = train_raw.train_test_split(test_size=d.eval_fraction, seed=recipe.training.seed)
        train_raw, eval_raw = split["train"], split["test"]
    if d.max_eval_samples:
        eval_raw = eval_raw.select(range(min(d.max_eval_samples, len(eval_raw))))
    return train_raw, eval_raw


def _capped(ds: datasets.Dataset, cap: int | None) -> datasets.Dataset:
    return ds.select(range(min(cap, len(ds)))) if cap else ds


def _encoded(ds: datasets.Dataset, tokenizer: Any, seq_len: int, text: str, labels: Callable[[datasets.Dataset], list]
             ) -> datasets.Dataset:
    """Rows of a text column tokenized and cut at `seq_len`, with their labels (padding is the collator's)."""
    enc = tokenizer(list(ds[text]), truncation=True, max_length=seq_len)
    return datasets.Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                       "labels": labels(ds)})


def prepare_classification(recipe: Recipe, raw: datasets.DatasetDict, tokenizer: Any) -> Prepared:
    """Classification: one truncated row per text, its class id the label; transformers' `DataCollatorWithPadding`
    pads the batches."""
    d = recipe.data
    train_raw, eval_raw = row_splits(recipe, raw)

    def rows(ds: datasets.Dataset) -> datasets.Dataset:
        return _encoded(ds, tokenizer, d.seq_len, d.text_column, lambda ds: list(ds[d.label_column]))

    return Prepared(rows(_capped(train_raw, d.max_train_samples)), rows(eval_raw), None, eval_raw,
                    collate=DataCollatorWithPadding(tokenizer))


def prepare_seq2seq(recipe: Recipe, raw: datasets.DatasetDict, tokenizer: Any) -> Prepared:
    """Seq2seq: the input column tokenized for the encoder, the target column as labels for the decoder (the model
    shifts them into its decoder inputs itself); transformers' `DataCollatorForSeq2Seq` pads the labels with
    IGNORE_INDEX, which the loss skips."""
    d = recipe.data
    train_raw, eval_raw = row_splits(recipe, raw)

    def rows(ds: datasets.Dataset) -> datasets.Dataset:
        return _encoded(ds, tokenizer, d.seq_len, d.text_column, lambda ds: tokenizer(
            text_target=list(ds[d.target_column]), truncation=True, max_length=d.seq_len)["input_ids"])

    return Prepared(rows(_capped(train_raw, d.max_train_samples)), rows(eval_raw), None, eval_raw,
                    collate=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX))


def prepare_completion(recipe: Recipe, raw: datasets.DatasetDict, tokenizer: Any) -> Prepared:
    """Prompt -> completion rows for a causal LM, tokenized apart and joined (a tokenizer that merges across the
    boundary cannot move it) with the completion's mask; TRL makes the labels of the completion only
    (`completion_only_loss`), cuts each row at `seq_len` and pads the batches."""
    d = recipe.data
    train_raw, eval_raw = row_splits(recipe, raw)

    def rows(ds: datasets.Dataset) -> datasets.Dataset:
        prompts = tokenizer(list(ds[d.text_column]))["input_ids"]
        answers = tokenizer(list(ds[d.target_column]), add_special_tokens=False)["input_ids"]
        return datasets.Dataset.from_dict({"input_ids": [p + a for p, a in zip(prompts, answers)],
                                           "completion_mask": [[0] * len(p) + [1] * len(a)
                                                               for p, a in zip(prompts, answers)]})

    return Prepared(rows(_capped(train_raw, d.max_train_samples)), rows(eval_raw), None, eval_raw, collate=None)


