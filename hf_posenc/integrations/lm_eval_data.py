"""Data of the offline lm-eval tasks (`lm_eval_tasks/*.yaml`, through their `custom_dataset`).

lm-eval loads task data with `datasets`; with no Hub, each function writes the project's local
text as JSON lines into `<hf_posenc cache>/lm_eval/` and loads that file with the `json` builder.
lm-eval calls them with its metadata (the `--model_args` and `--metadata` entries) as keywords.
This is the one module of the integrations that reads `hf_posenc.data` and the passkey prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Any, Sequence

import datasets

from .. import data
from ..errors import PosEncError
from ..evaluation import passkey_prompt

# The tail of the text that training recipes hold out for evaluation (recipe `data.eval_fraction`).
HELD_OUT_FRACTION = 0.02
# Passkey lengths the task reports, one metric each (lm-eval needs metric names in the YAML).
PASSKEY_LENGTHS = tuple(2**k for k in range(9, 18))  # 512 .. 131072 tokens
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _write(name: str, rows: list[dict[str, Any]]) -> datasets.DatasetDict:
    """Write rows as `<cache>/lm_eval/<name>.jsonl` (atomically: every rank of a multi-process run writes
    it) and load it as the `test` split."""
    folder = data.cache_dir() / "lm_eval"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)
    return datasets.load_dataset("json", data_files={"test": str(path)})


def kjv_held_out(**metadata: Any) -> datasets.DatasetDict:
    """The King James Bible books that lie wholly in its held-out tail (1 John .. Revelation), one
    document per book, for rolling perplexity. Columns: `title`, `text`."""
    text = data.long_text("kjv")
    cut = int(len(text) * (1 - HELD_OUT_FRACTION))
    parts = text.split("\n\n")  # book name, verses, book name, verses, ...
    rows, offset = [], 0
    for title, verses in zip(parts[::2], parts[1::2]):
        if offset >= cut:
            rows.append({"title": title, "text": verses})
        offset += len(title) + len(verses) + 4
    return _write("kjv_held_out", rows)


def sentiment(**metadata: Any) -> datasets.DatasetDict:
    """The test split of the offline movie-review sentiment set. Columns: `text`, `label` (0 = negative)."""
    test = data.sentiment_dataset(seed=0)["test"]
    return _write("sentiment_test", [{"text": t, "label": int(y)} for t, y in zip(test["text"], test["label"])])


def passkey(passkey_lengths: Sequence[int] | int = (512, 1024, 2048, 4096), passkey_trials: int = 2,
            passkey_seed: int = 0, **metadata: Any) -> datasets.DatasetDict:
    """Passkey prompts (Mohtashami & Jaggi 2023) sized in the evaluated model's tokens.

    Args:
        passkey_lengths: prompt lengths in tokens, from `PASSKEY_LENGTHS` (`--metadata`).
        passkey_trials: prompts per length and needle depth, each with its own random key.
        passkey_seed: seeds the keys.
        metadata: lm-eval's metadata; its `tokenizer` or `pretrained` names the tokenizer.
    Columns: `prompt`, `key`, `length`, `depth`.
    """
    lengths = [passkey_lengths] if isinstance(passkey_lengths, int) else list(passkey_lengths)
    if not lengths or any(length not in PASSKEY_LENGTHS for length in lengths):
        raise PosEncError(f"passkey_lengths must be taken from {', '.join(map(str, PASSKEY_LENGTHS))}; "
                          f"got {passkey_lengths!r}")
    tokenizer_name = metadata.get("tokenizer") or metadata.get("pretrained")
    if not isinstance(tokenizer_name, str):
        raise PosEncError("posenc_passkey sizes its prompts in the model's tokens: pass a tokenizer name or folder "
                          "with --metadata '{\"tokenizer\": ...}' (model_args pretrained= is used when it is a string)")
    tokenizer = _tokenizer(tokenizer_name)
    rng = random.Random(passkey_seed)
    rows = [
        {"prompt": passkey_prompt(tokenizer, length, depth, key), "key": str(key), "length": length, "depth": depth}
        for length in lengths for depth in PASSKEY_DEPTHS for key in (rng.randint(1, 50000) for _ in range(passkey_trials))
    ]
    digest = hashlib.sha1(json.dumps([tokenizer_name, lengths, passkey_trials, passkey_seed]).encode()).hexdigest()[:12]
    return _write(f"passkey_{digest}", rows)


def _tokenizer(name: str) -> Any:
    """Through hf-posenc's reader: a folder hf-posenc wrote gets its stock config, so no remote-code prompt."""
    from ..loading import load_tokenizer

    return load_tokenizer(name)


def passkey_results(doc: dict[str, Any], results: list[tuple[float, bool]]) -> dict[str, float]:
    """Greedy retrieval: 1 if the key is the model's greedy continuation, under `acc` and the prompt's length."""
    (_, is_greedy), = results
    return {"acc": float(is_greedy), str(doc["length"]): float(is_greedy)}
