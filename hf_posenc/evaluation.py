"""Score (patched) models in memory: perplexity by length, passkey retrieval, length generalisation
and sentiment classification, plus the `hf-posenc eval` command that writes results.json and plots.

Everything runs on the model object itself, so a model patched with `hf_posenc.patch` is scored as
patched (evaluate's own perplexity metric reloads a model by id and cannot do that). Scores are
aggregated by the evaluate modules in `hf_posenc/metrics/`.

results.json schema (format 1):
    {"format": 1, "label": str, "model": str, "scheme": str | null, "options": {...},
     "posenc": {...} | null,                # hf_posenc.describe(model) after loading/patching
     "settings": {"suite": [...], "lengths": [...], "stride": ..., "text": ..., ...},
     "results": {
        "ppl":     {"<length>": {"perplexity", "loss", "tokens", "windows", "stride"} | {"skipped": reason}},
        "passkey": {"<length>": {"accuracy", "by_depth": {"<depth>": acc}, "trials", "tokens"} | {"skipped": reason}},
        "sst2":    {"accuracy", "f1", "examples", "mode"},
        "copy" | "reverse" | "addition": {"<task length>": exact_match} },
     "versions": {"python", "torch", "transformers", ...}, "started": iso, "wall_time_s": float,
     "complete": bool}
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import math
import platform
import random
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import datasets
import evaluate
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
)

from . import data
from .commands import parse_options
from .errors import PosEncError
from .models import model_source

__all__ = [
    "PASSKEY_FILLER",
    "SUITES",
    "classification",
    "compare",
    "length_generalization",
    "load_metric",
    "load_model",
    "main",
    "make_parser",
    "passkey",
    "passkey_prompt",
    "perplexity_by_length",
    "plot_results",
    "prefix_perplexity",
    "run_suites",
    "text_token_ids",
    "versions",
]

METRICS_DIR = Path(__file__).parent / "metrics"
SUITES = ("ppl", "passkey", "sst2", *data.SYNTHETIC_TASKS)
# Rows of hidden states sent through the output head at once: bounds the fp32 logits to
# LOGIT_CHUNK x vocab (200 MB for a 49k vocabulary) whatever the context length.
LOGIT_CHUNK = 1024
# Offline models that packages ship (../shared/ASSETS.md): name -> (distribution, folder, gguf file).
# The passkey prompt of Mohtashami & Jaggi 2023 (Landmark Attention, run_test.py), also used by
# Chen et al. 2023 (Position Interpolation): task, filler, needle at a depth, filler, question.
PASSKEY_TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
# Zero-shot sentiment for causal LMs: compare the next-token scores of two label words
# (the "verbalizer" of Schick & Schuetze 2021; prompting as in Brown et al. 2020).
SENTIMENT_PROMPT = "Review: {text}\nSentiment (positive or negative):"
SENTIMENT_WORDS = (" negative", " positive")


def _names(mapping: dict) -> set[str]:
    return {n for v in mapping.values() for n in ((v,) if isinstance(v, str) else v)}


CAUSAL_LM_CLASSES = _names(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
MASKED_LM_CLASSES = _names(MODEL_FOR_MASKED_LM_MAPPING_NAMES)
CLASSIFIER_CLASSES = _names(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


@functools.lru_cache(maxsize=None)
def load_metric(name: str) -> evaluate.EvaluationModule:
    """One of the evaluate modules shipped in hf_posenc/metrics (they work offline)."""
    path = METRICS_DIR / name
    if not path.is_dir():
        known = sorted(p.name for p in METRICS_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))
        raise PosEncError(f"no metric {name!r}; hf_posenc ships {', '.join(known)}")
    return evaluate.load(str(path))


# ---------------------------------------------------------------- running models


def _output_head(model: torch.nn.Module) -> torch.nn.Module:
    name = type(model).__name__
    if name in MASKED_LM_CLASSES or getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise PosEncError(f"{name} is not a causal LM; perplexity and passkey need one (AutoModelForCausalLM)")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise PosEncError(f"{name} has no output head; load it with AutoModelForCausalLM")
    return head


def _head_inputs(model: torch.nn.Module, head: torch.nn.Module, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The final hidden states (B, T, d) that the model feeds its output head.

    The head itself is then run on one position only: callers compute logits just for the rows
    they score, in chunks, so memory stays bounded at any context length (a full (T, vocab) fp32
    logits tensor is 3.2 GB at 16k tokens for a 49k vocabulary).
    """
    captured: list[torch.Tensor] = []

    def keep_input(module: torch.nn.Module, args: tuple) -> tuple:
        captured.append(args[0])
        return (args[0][..., -1:, :], *args[1:])

    handle = head.register_forward_pre_hook(keep_input)
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        handle.remove()
    if not captured:
        raise PosEncError(f"{type(model).__name__} never called its output head {type(head).__name__}")
    return captured[-1]


def _logits(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits for rows of hidden states (bf16-safe: the softmax is never taken in half precision)."""
    with torch.no_grad():
        return head(hidden).float()


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _check_lengths(lengths: Sequence[int], what: str = "length") -> list[int]:
    if not lengths:
        raise PosEncError(f"give at least one {what}")
    bad = [L for L in lengths if not isinstance(L, int) or isinstance(L, bool) or L <= 0]
    if bad:
        raise PosEncError(f"every {what} must be a positive integer number of tokens; got {bad}")
    return list(lengths)


# Exceptions that mean "this model cannot handle this length" (a learned table indexed past its end,
# a PosEncError from a patch, out of memory): recorded as skipped so a sweep keeps its other results.
LENGTH_FAILURES = (ValueError, IndexError, RuntimeError)


def _skipped(err: BaseException) -> dict[str, str]:
    return {"skipped": f"{type(err).__name__}: {err}".strip()[:500]}


# ---------------------------------------------------------------- perplexity


def perplexity_by_length(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    lengths: Sequence[int],
    stride: int | None = None,
    batch_size: int = 1,
    max_windows: int | None = None,
    *,
    progress: bool = False,
) -> dict[int, dict[str, Any]]:
    """Sliding-window perplexity of one token stream at each context length.

    Windows of `length` tokens start every `stride` tokens (default: `length`, i.e. disjoint
    chunks). The first window scores all its tokens; each later one scores only the `stride`
    tokens no earlier window scored, with the rest as context ("Perplexity of fixed-length
    models", transformers docs; Press et al. 2021, sliding-window evaluation). With stride ==
    length this equals the plain loss of `model(chunk, labels=chunk)` averaged over chunks.

    Args:
        model: a causal LM, patched or not; it is run under no_grad.
        input_ids: 1-D token ids of a long text (see `hf_posenc.data.long_text`).
        lengths: context lengths in tokens; each must be > 0.
        stride: tokens between window starts, clipped to each length.
        batch_size: windows per forward pass.
        max_windows: score at most this many windows per length (bounds the cost).
        progress: show a tqdm bar per length.
    Returns:
        {length: {"perplexity", "loss" (mean nats/token), "tokens", "windows", "stride"}}, or
        {length: {"skipped": reason}} where the model could not run at that length.
    """
    lengths = _check_lengths(lengths)
    ids = _token_stream(input_ids)
    if stride is not None and stride <= 0:
        raise PosEncError(f"stride must be a positive number of tokens, got {stride}")
    if batch_size <= 0 or (max_windows is not None and max_windows <= 0):
        raise PosEncError(f"batch_size and max_windows must be positive, got {batch_size} and {max_windows}")
    head = _output_head(model)
    results: dict[int, dict[str, Any]] = {}
    for length in lengths:
        reason = _unscorable(length, ids.numel())
        if reason:
            results[length] = reason
            continue
        try:
            results[length] = _perplexity_at(model, head, ids, length, min(stride or length, length),
                                             batch_size, max_windows, progress)
        except LENGTH_FAILURES as err:
            results[length] = _skipped(err)
    return results


def _token_stream(input_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    ids = torch.as_tensor(input_ids).long()
    if ids.dim() != 1:
        raise PosEncError(f"input_ids must be 1-D token ids of one text, got shape {tuple(ids.shape)}; pass ids[0]")
    return ids


def _unscorable(length: int, n_tokens: int) -> dict[str, str] | None:
    if length < 2:
        return {"skipped": "a 1-token window has nothing to predict; use lengths >= 2"}
    if n_tokens < length:
        return {"skipped": f"the text has {n_tokens} tokens, fewer than {length}; pass a longer text"}
    return None


def _perplexity_at(model: PreTrainedModel, head: torch.nn.Module, ids: torch.Tensor, length: int, stride: int,
                   batch_size: int, max_windows: int | None, progress: bool) -> dict[str, Any]:
    starts = list(range(0, ids.numel() - length + 1, stride))[:max_windows]
    device = _device(model)
    nll = torch.zeros((), dtype=torch.float64)
    count = 0
    bar = tqdm(total=len(starts), desc=f"perplexity @ {length}", unit="window", disable=not progress)
    for i in range(0, len(starts), batch_size):
        batch = starts[i : i + batch_size]
        windows = torch.stack([ids[s : s + length] for s in batch]).to(device)
        hidden = _head_inputs(model, head, windows)
        for row, start in enumerate(batch):
            # targets at window positions [first, length): tokens no earlier window scored
            first = 1 if start == 0 else max(1, length - stride)
            for lo in range(first, length, LOGIT_CHUNK):
                hi = min(lo + LOGIT_CHUNK, length)
                logits = _logits(head, hidden[row, lo - 1 : hi - 1])
                nll += F.cross_entropy(logits, windows[row, lo:hi], reduction="sum").double().cpu()
            count += length - first
        bar.update(len(batch))
    bar.close()
    loss = (nll / count).item()
    return {"perplexity": math.exp(loss), "loss": loss, "tokens": count, "windows": len(starts), "stride": stride}


def prefix_perplexity(
    model: PreTrainedModel, input_ids: torch.Tensor, lengths: Sequence[int], *, progress: bool = False
) -> dict[int, dict[str, Any]]:
    """Perplexity of the first `length` tokens for every length, from one forward pass of the longest.

    In a causal model the logits at position t do not depend on later tokens, so this equals
    `perplexity_by_length(model, ids, [length], max_windows=1)` for each length at the cost of the
    longest alone -- provided positions are static (learned, RoPE and its linear/NTK/YaRN scalings,
    ALiBi). It does not hold for `dynamic` scaling, whose frequencies depend on the total length.
    If the longest length fails, every length is recorded as skipped.
    """
    lengths = sorted(_check_lengths(lengths))
    ids = _token_stream(input_ids)
    head = _output_head(model)
    reasons = {L: _unscorable(L, ids.numel()) for L in lengths}
    results = {L: reason for L, reason in reasons.items() if reason}
    fitting = [L for L in lengths if L not in results]
    if not fitting:
        return results
    longest = fitting[-1]
    window = ids[None, :longest].to(_device(model))
    try:
        hidden = _head_inputs(model, head, window)[0]
        nll = torch.cat([
            F.cross_entropy(_logits(head, hidden[lo - 1 : min(lo + LOGIT_CHUNK, longest) - 1]),
                            window[0, lo : min(lo + LOGIT_CHUNK, longest)], reduction="none").double().cpu()
            for lo in tqdm(range(1, longest, LOGIT_CHUNK), desc=f"prefix perplexity @ {longest}", disable=not progress)
        ]).cumsum(0)
    except LENGTH_FAILURES as err:
        return {**results, **{L: _skipped(err) for L in fitting}}
    for L in fitting:
        loss = (nll[L - 2] / (L - 1)).item()
        results[L] = {"perplexity": math.exp(loss), "loss": loss, "tokens": L - 1, "windows": 1, "stride": L}
    return dict(sorted(results.items()))


def text_token_ids(tokenizer: PreTrainedTokenizerBase, text: str, n_tokens: int | None = None) -> torch.Tensor:
    """The first `n_tokens` token ids of a text (all if None), tokenizing only as much of it as needed."""
    if n_tokens is None:
        return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    chars = max(n_tokens * 8, 1000)  # English averages ~4 characters per BPE token
    while True:
        ids = tokenizer(text[:chars], add_special_tokens=False)["input_ids"]
        if len(ids) > n_tokens or chars >= len(text):
            return torch.tensor(ids[:n_tokens], dtype=torch.long)
        chars *= 2


# ---------------------------------------------------------------- greedy answers in one forward


def _greedy_answers(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                    answers: Sequence[str], *, extra: int = 0, batch_size: int = 1,
                    desc: str = "", progress: bool = False) -> list[str]:
    """What greedy decoding would answer, from one teacher-forced forward pass per prompt.

    The argmax at each answer position is taken given the true prefix: all of them equal the
    reference answer exactly when `generate(do_sample=False)` would produce it, so exact-match
    accuracy is that of greedy generation at the cost of one forward pass and no KV cache.
    `extra` more positions past the answer are decoded too (to catch e.g. a longer number).
    """
    head = _output_head(model)
    rows = []
    for prompt, answer in zip(prompts, answers):
        prompt_ids = tokenizer(prompt)["input_ids"]
        full_ids = tokenizer(prompt + answer)["input_ids"]
        if full_ids[: len(prompt_ids)] != prompt_ids or len(full_ids) == len(prompt_ids):
            raise PosEncError(
                f"the tokenizer does not split {answer!r} from the prompt cleanly (prompt tokens are not a prefix); "
                "use a tokenizer that does not add end-of-sequence tokens"
            )
        rows.append((full_ids, len(prompt_ids)))
    if batch_size > 1:
        _require_pad(tokenizer)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))  # similar lengths share a batch
    out: dict[int, str] = {}
    for i in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=not progress):
        idx = order[i : i + batch_size]
        hidden = _padded_hidden(model, head, [rows[j][0] for j in idx], tokenizer.pad_token_id)
        for r, j in enumerate(idx):
            full_ids, start = rows[j]
            stop = min(len(full_ids), len(full_ids) - 1 + extra)  # hidden at p predicts token p + 1
            picked = _logits(head, hidden[r, start - 1 : stop]).argmax(-1).tolist()
            out[j] = tokenizer.decode(picked, skip_special_tokens=True)
    return [out[j] for j in range(len(rows))]


def _padded_hidden(model: PreTrainedModel, head: torch.nn.Module, rows: Sequence[Sequence[int]],
                   pad_id: int | None) -> torch.Tensor:
    """Final hidden states of token rows of different lengths, right-padded (every real token keeps
    its own position, so no position ids are needed); a single row is run without a mask."""
    if len(rows) == 1:
        return _head_inputs(model, head, torch.tensor([list(rows[0])], device=_device(model)))
    ids = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    device = _device(model)
    return _head_inputs(model, head, ids.to(device), mask.to(device))


def _require_pad(tokenizer: PreTrainedTokenizerBase) -> None:
    if tokenizer.pad_token_id is None:
        raise PosEncError(
            "the tokenizer has no pad token, needed to batch inputs of different lengths; set one first, e.g. "
            "`tokenizer.pad_token = tokenizer.eos_token`, or use batch_size=1"
        )


# ---------------------------------------------------------------- passkey


def passkey_prompt(tokenizer: PreTrainedTokenizerBase, length: int, depth: float, key: int) -> str:
    """The passkey prompt of about `length` tokens (never more, answer included), needle at `depth`."""
    if not 0.0 <= depth <= 1.0:
        raise PosEncError(f"depth must be in [0, 1] (0 = needle first, 1 = needle last), got {depth}")

    def build(n_filler: int) -> str:
        before = round(depth * n_filler)
        lines = [PASSKEY_TASK, " ".join([PASSKEY_FILLER] * before), PASSKEY_NEEDLE.format(key=key),
                 " ".join([PASSKEY_FILLER] * (n_filler - before)), PASSKEY_QUESTION]
        return "\n".join(lines)

    def size(n_filler: int) -> int:
        return len(tokenizer(build(n_filler) + f" {key}")["input_ids"])

    per_filler = max(1.0, (size(11) - size(1)) / 10)
    n_filler = max(0, int((length - size(0)) / per_filler))
    while n_filler > 0 and size(n_filler) > length:
        n_filler -= 1
    if size(n_filler) > length:
        raise PosEncError(f"length {length} is too short for the passkey prompt, which needs {size(0)} tokens")
    return build(n_filler)


def passkey(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lengths: Sequence[int],
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    trials: int = 2,
    *,
    seed: int = 0,
    progress: bool = False,
) -> dict[int, dict[str, Any]]:
    """Passkey retrieval accuracy by context length x needle depth.

    Args:
        model: a causal LM; tokenizer: its tokenizer.
        lengths: prompt lengths in tokens (each prompt fills its length as closely as whole
            filler sentences allow).
        depths: needle positions in [0, 1].
        trials: prompts (random keys in 1..50000, as in Landmark Attention) per length and depth.
        seed: seeds the keys.
    Returns:
        {length: {"accuracy", "by_depth": {depth: accuracy}, "trials", "tokens" (mean prompt length)}}
        or {length: {"skipped": reason}}.
    """
    lengths = _check_lengths(lengths)
    if trials <= 0 or not depths or not all(0.0 <= d <= 1.0 for d in depths):
        raise PosEncError(f"need trials > 0 and depths in [0, 1] (0 = needle first, 1 = last), "
                          f"got trials={trials}, depths={list(depths)}")
    _output_head(model)
    rng = random.Random(seed)
    metric = load_metric("passkey")
    results: dict[int, dict[str, Any]] = {}
    for length in lengths:
        keys = [str(rng.randint(1, 50000)) for _ in depths for _ in range(trials)]
        cells = [d for d in depths for _ in range(trials)]
        try:
            prompts = [passkey_prompt(tokenizer, length, d, int(k)) for d, k in zip(cells, keys)]
        except PosEncError as err:
            results[length] = {"skipped": str(err)}
            continue
        try:
            answers = _greedy_answers(model, tokenizer, prompts, [f" {k}" for k in keys], extra=1,
                                      desc=f"passkey @ {length}", progress=progress)
        except LENGTH_FAILURES as err:
            results[length] = _skipped(err)
            continue
        # the first number in the greedy continuation is the answer, as in Landmark Attention's scorer
        numbers = [(re.findall(r"\d+", a) or [""])[0] for a in answers]
        scored = metric.compute(predictions=numbers, references=keys, lengths=[length] * len(keys), depths=cells)
        cell = scored["by_length"][length]
        cell["tokens"] = sum(len(tokenizer(p)["input_ids"]) for p in prompts) / len(prompts)
        results[length] = cell
    return results


# ---------------------------------------------------------------- length generalisation


def length_generalization(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: datasets.Dataset,
    *,
    prefix: str = "",
    batch_size: int = 8,
    progress: bool = False,
) -> dict[str, Any]:
    """Exact-match accuracy by task length on a synthetic task (see `hf_posenc.data.synthetic_task`).

    Args:
        dataset: columns `prompt`, `target`, `length`.
        prefix: text put before every prompt (few-shot examples for a model not trained on the task).
        batch_size: prompts per forward pass (> 1 needs a pad token).
    Returns:
        {"exact_match": float, "by_length": {length: float}}.
    """
    missing = {"prompt", "target", "length"} - set(dataset.column_names)
    if missing:
        raise PosEncError(f"the dataset lacks columns {sorted(missing)}; build it with hf_posenc.data.synthetic_task")
    predictions = _greedy_answers(model, tokenizer, [prefix + p for p in dataset["prompt"]], dataset["target"],
                                  batch_size=batch_size, desc="length generalisation", progress=progress)
    return load_metric("length_generalization").compute(
        predictions=predictions, references=dataset["target"], lengths=dataset["length"]
    )


# ---------------------------------------------------------------- classification


def classification(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: datasets.Dataset,
    *,
    text_column: str = "text",
    label_column: str = "label",
    batch_size: int = 16,
    limit: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Binary sentiment accuracy and F1 of a sequence classifier, or zero-shot for a causal LM.

    A `*ForSequenceClassification` model predicts the argmax of its logits; a causal LM predicts
    the label word (" negative" / " positive") it scores higher after a review prompt.
    """
    for column in (text_column, label_column):
        if column not in dataset.column_names:
            raise PosEncError(
                f"the dataset has no column {column!r}; its columns are {dataset.column_names}. "
                "Pass text_column= / label_column= naming the right ones."
            )
    _require_pad(tokenizer)
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    name = type(model).__name__
    if name in CLASSIFIER_CLASSES:
        mode, predict = "classifier", functools.partial(_classifier_predict, model, tokenizer)
    elif name not in MASKED_LM_CLASSES and name in CAUSAL_LM_CLASSES:
        mode, predict = "zero-shot", functools.partial(_zero_shot_predict, model, tokenizer)
    else:
        raise PosEncError(f"{name} is neither a sequence classifier nor a causal LM; load it with "
                          "AutoModelForSequenceClassification (then fine-tune) or AutoModelForCausalLM")
    texts, labels = dataset[text_column], dataset[label_column]
    predictions: list[int] = []
    for i in tqdm(range(0, len(texts), batch_size), desc=f"sst2 ({mode})", unit="batch", disable=not progress):
        predictions += predict(texts[i : i + batch_size])
    scores = evaluate.combine([load_metric("accuracy"), load_metric("f1")]).compute(
        predictions=predictions, references=labels
    )
    return {**scores, "examples": len(labels), "mode": mode}


def _classifier_predict(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[int]:
    # truncation to the tokenizer's model_max_length (512 for BERT-family tokenizers), as in fine-tuning
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(_device(model))
    with torch.no_grad():
        return model(**enc).logits.argmax(-1).tolist()


def _zero_shot_predict(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[int]:
    """The label word the model scores higher right after the prompt. Tokens the label words share
    (e.g. a leading space under a character tokenizer) are appended to the prompt first, and the
    words compared at their first differing token."""
    head = _output_head(model)
    words = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in SENTIMENT_WORDS]
    shared = 0
    while shared < min(map(len, words)) - 1 and words[0][shared] == words[1][shared]:
        shared += 1
    if words[0][shared] == words[1][shared]:
        raise PosEncError(f"the tokenizer cannot tell the label words {SENTIMENT_WORDS} apart")
    rows = [tokenizer(SENTIMENT_PROMPT.format(text=t))["input_ids"] + words[0][:shared] for t in texts]
    hidden = _padded_hidden(model, head, rows, tokenizer.pad_token_id)
    last = torch.tensor([len(r) - 1 for r in rows], device=hidden.device)
    logits = _logits(head, hidden[torch.arange(len(rows), device=hidden.device), last])
    return logits[:, [words[0][shared], words[1][shared]]].argmax(-1).tolist()


# ---------------------------------------------------------------- loading


def load_model(
    name_or_path: str,
    *,
    model_cls: type = AutoModelForCausalLM,
    dtype: torch.dtype = torch.float32,
    scheme: str | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model and its tokenizer, optionally patched, in eval mode.

    Args:
        name_or_path: a name from `hf_posenc.models.NAMED_MODELS` ("smollm2", "minilm": shipped by
            packages, offline), a local folder or a Hub id. Folders saved after `hf_posenc.patch` come back patched.
        model_cls: the transformers auto class to load with.
        dtype: parameter dtype (GGUF weights are dequantized to it).
        scheme, options: apply `hf_posenc.patch(model, scheme, **options)` after loading.
    """
    import hf_posenc

    path, kwargs = model_source(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    model = hf_posenc.from_pretrained(path, model_cls=model_cls, dtype=dtype, **kwargs)
    if scheme is not None:
        hf_posenc.patch(model, scheme, **(options or {}))
    return model.eval(), tokenizer


# ---------------------------------------------------------------- the eval command


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Evaluate a (patched) model: perplexity by length, passkey retrieval, sentiment, length generalisation."
    parser.epilog = (
        "examples:\n"
        "  hf-posenc eval --model smollm2 --suite ppl,passkey --lengths 512,2048,8192 --out out/orig\n"
        "  hf-posenc eval --model smollm2 --patch yarn --opt factor=4 --suite ppl --lengths 512,16384 --out out/yarn4\n"
        "  hf-posenc eval --model ./my-patched-model --suite sst2 --limit 500 --out out/sst2\n"
        "  hf-posenc eval --compare out/orig/results.json out/yarn4/results.json --out out/compare\n"
    )
    parser.add_argument("--model", help="'smollm2' (offline package model), a saved folder or a Hub id")
    parser.add_argument("--patch", dest="scheme", metavar="SCHEME", help="apply hf_posenc.patch(model, SCHEME) first")
    parser.add_argument("--opt", action="append", default=[], metavar="K=V", help="scheme option, repeatable (e.g. factor=4)")
    parser.add_argument("--suite", default="ppl,passkey", help=f"comma-separated, from: {', '.join(SUITES)}")
    parser.add_argument("--lengths", default="512,1024,2048", help="context lengths in tokens (ppl, passkey)")
    parser.add_argument("--text", default="kjv", help="long text for ppl: 'kjv' (offline) or a datasets name")
    parser.add_argument("--text-config", default=None, help="datasets config of --text (e.g. wikitext-103-raw-v1)")
    parser.add_argument("--text-column", default="text", help="text column of a datasets --text")
    parser.add_argument("--stride", type=int, default=None, help="sliding-window stride (default: the length)")
    parser.add_argument("--max-windows", type=int, default=4, help="ppl windows per length (bounds the cost)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="passkey needle depths in [0, 1]")
    parser.add_argument("--trials", type=int, default=2, help="passkey prompts per length and depth")
    parser.add_argument("--task-lengths", default="2,4,8,16", help="digits per example for copy/reverse/addition")
    parser.add_argument("--examples", type=int, default=20, help="examples per task length (copy/reverse/addition)")
    parser.add_argument("--limit", type=int, default=None, help="sst2: score only the first N test sentences")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output folder (results.json, *.png)")
    parser.add_argument("--compare", nargs="+", metavar="RESULTS_JSON", help="merge results files into a table + plot")


def _int_list(text: str, what: str) -> list[int]:
    try:
        return _check_lengths([int(x) for x in text.split(",") if x.strip()], what)
    except ValueError as err:
        if isinstance(err, PosEncError):
            raise
        raise PosEncError(f"{what}s must be comma-separated integers, got {text!r}") from err


def _float_list(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise PosEncError(f"{what}s must be comma-separated numbers, got {text!r}") from err


def parse_suites(text: str) -> list[str]:
    suites = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITES]
    if unknown or not suites:
        raise PosEncError(f"unknown suite {', '.join(map(repr, unknown)) or '(none)'}; choose from {', '.join(SUITES)}")
    return suites


def versions() -> dict[str, str]:
    """Installed versions of what a result depends on, for results files."""
    names = ["hf-posenc", "torch", "transformers", "accelerate", "datasets", "evaluate"]
    found = {"python": platform.python_version()}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def run_label(model: str, scheme: str | None, options: dict[str, Any]) -> str:
    opts = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{Path(model).name or model} {scheme}({opts})" if scheme else f"{Path(model).name or model} (as loaded)"


class _Results:
    """results.json, rewritten atomically after every length so finished work survives a crash."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path, self.data, self.t0 = path, {**header, "results": {}, "complete": False}, time.perf_counter()
        self.save()

    def put(self, suite: str, key: str | None, value: Any) -> None:
        if key is None:
            self.data["results"][suite] = value
        else:
            self.data["results"].setdefault(suite, {})[key] = value
        self.save()

    def save(self, complete: bool = False) -> None:
        self.data["wall_time_s"] = round(time.perf_counter() - self.t0, 2)
        self.data["complete"] = complete
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


def run_suites(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    suites: Sequence[str],
    lengths: Sequence[int],
    out: str | Path,
    *,
    header: dict[str, Any] | None = None,
    text: str = "kjv",
    text_config: str | None = None,
    text_column: str = "text",
    stride: int | None = None,
    max_windows: int | None = 4,
    batch_size: int = 1,
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    trials: int = 2,
    task_lengths: Sequence[int] = (2, 4, 8, 16),
    examples: int = 20,
    limit: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Run suites on an in-memory model, writing `out/results.json` as it goes and plots at the end."""
    suites = parse_suites(",".join(suites))
    lengths = _check_lengths(lengths)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    import hf_posenc

    described = hf_posenc.describe(model)
    settings = {"suite": suites, "lengths": lengths, "text": text, "text_config": text_config, "stride": stride,
                "max_windows": max_windows, "batch_size": batch_size, "depths": list(depths), "trials": trials,
                "task_lengths": list(task_lengths), "examples": examples, "limit": limit, "seed": seed}
    record = _Results(out / "results.json", {
        "format": 1, **(header or {}), "posenc": described.to_dict() if described else None,
        "settings": settings, "versions": versions(), "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    if "ppl" in suites:
        source = data.long_text(text, text_column=text_column, config=text_config)
        need = None if max_windows is None else max(lengths) + max_windows * (stride or max(lengths))
        ids = text_token_ids(tokenizer, source, need)
        for length in lengths:
            value = perplexity_by_length(model, ids, [length], stride, batch_size, max_windows, progress=True)[length]
            record.put("ppl", str(length), value)
    if "passkey" in suites:
        for length in lengths:
            value = passkey(model, tokenizer, [length], depths, trials, seed=seed + length, progress=True)[length]
            if "by_depth" in value:
                value["by_depth"] = {str(d): acc for d, acc in value["by_depth"].items()}
            record.put("passkey", str(length), value)
    if "sst2" in suites:
        test = data.sentiment_dataset(seed=seed)["test"]
        record.put("sst2", None, classification(model, tokenizer, test, batch_size=max(batch_size, 16),
                                                limit=limit, progress=True))
    for task in data.SYNTHETIC_TASKS:
        if task in suites:
            for length in _check_lengths(list(task_lengths), "task length"):
                shots = data.synthetic_task(task, length, 3, seed=seed + 1000)
                prefix = "".join(f"{p}{t}\n" for p, t in zip(shots["prompt"], shots["target"]))
                scored = length_generalization(model, tokenizer, data.synthetic_task(task, length, examples, seed),
                                               prefix=prefix, batch_size=max(batch_size, 8), progress=True)
                record.put(task, str(length), scored["exact_match"])
    record.save(complete=True)
    plot_results([record.data], out)
    return record.data


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.compare:
        table = compare(args.compare, out)
        print(table)
        return 0
    if not args.model:
        raise PosEncError("give --model (a folder, a Hub id or 'smollm2') or --compare RESULTS_JSON ...")
    suites = parse_suites(args.suite)
    lengths = _int_list(args.lengths, "length")
    options = parse_options(args.opt)
    if options and not args.scheme:
        raise PosEncError("--opt needs --patch SCHEME to apply to")
    model, tokenizer = load_model(args.model, dtype=getattr(torch, args.dtype), scheme=args.scheme, options=options)
    header = {"label": run_label(args.model, args.scheme, options), "model": args.model, "scheme": args.scheme,
              "options": options}
    record = run_suites(
        model, tokenizer, suites, lengths, out, header=header, text=args.text, text_config=args.text_config,
        text_column=args.text_column, stride=args.stride, max_windows=args.max_windows, batch_size=args.batch_size,
        depths=_float_list(args.depths, "depth"), trials=args.trials,
        task_lengths=_int_list(args.task_lengths, "task length"), examples=args.examples, limit=args.limit,
        seed=args.seed,
    )
    print(f"wrote {out / 'results.json'} ({record['wall_time_s']} s)")
    return 0


# ---------------------------------------------------------------- plots and comparison


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(cells: dict[str, Any], field: str) -> tuple[list[int], list[float]]:
    points = sorted((int(k), v[field]) for k, v in cells.items() if isinstance(v, dict) and field in v)
    return [p[0] for p in points], [p[1] for p in points]


def plot_results(runs: Sequence[dict[str, Any]], out: str | Path) -> list[Path]:
    """perplexity.png (one line per run), passkey.png (heatmap per run, or mean accuracy lines when
    comparing), length_generalization.png; returns the files written."""
    plt, out, written = _pyplot(), Path(out), []
    ppl_runs = [r for r in runs if r["results"].get("ppl")]
    if ppl_runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in ppl_runs:
            xs, ys = _series(run["results"]["ppl"], "perplexity")
            ax.plot(xs, ys, marker="o", label=run.get("label", run.get("model")))
        ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="perplexity",
               title="Perplexity by context length")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
        written.append(_save(fig, out / "perplexity.png"))
    key_runs = [r for r in runs if r["results"].get("passkey")]
    if len(key_runs) == 1:
        written.append(_passkey_heatmap(plt, key_runs[0], out / "passkey.png"))
    elif key_runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in key_runs:
            xs, ys = _series(run["results"]["passkey"], "accuracy")
            ax.plot(xs, ys, marker="o", label=run.get("label", run.get("model")))
        ax.set(xlabel="context length (tokens)", ylabel="passkey accuracy", ylim=(-0.05, 1.05),
               title="Passkey retrieval")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
        written.append(_save(fig, out / "passkey.png"))
    task_cells = [(r, t) for r in runs for t in data.SYNTHETIC_TASKS if r["results"].get(t)]
    if task_cells:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run, task in task_cells:
            points = sorted((int(k), v) for k, v in run["results"][task].items())
            ax.plot(*zip(*points), marker="o", label=f"{run.get('label', run.get('model'))} {task}")
        ax.set(xlabel="task length (digits)", ylabel="exact match", ylim=(-0.05, 1.05), title="Length generalisation")
        ax.legend(fontsize=8)
        written.append(_save(fig, out / "length_generalization.png"))
    return written


def _passkey_heatmap(plt: Any, run: dict[str, Any], path: Path) -> Path:
    cells = {int(k): v for k, v in run["results"]["passkey"].items() if "by_depth" in v}
    lengths = sorted(cells)
    depths = sorted({float(d) for v in cells.values() for d in v["by_depth"]})
    grid = [[cells[L]["by_depth"].get(str(d), cells[L]["by_depth"].get(d, float("nan"))) for L in lengths] for d in depths]
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.6 * len(depths) + 1.5))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set(xlabel="context length (tokens)", ylabel="needle depth", title=f"Passkey: {run.get('label', '')}")
    fig.colorbar(image, ax=ax, label="accuracy")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def compare(paths: Sequence[str | Path], out: str | Path) -> str:
    """Merge results files into out/compare.json, a Markdown table out/compare.md, and plots."""
    runs = []
    for path in paths:
        try:
            run = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise PosEncError(f"cannot read results file {path}: {err}") from err
        if not isinstance(run, dict) or "results" not in run:
            raise PosEncError(f"{path} is not a results.json written by `hf-posenc eval`")
        runs.append(run)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| run | metric | value |", "|---|---|---|"]
    for run in runs:
        label = run.get("label", run.get("model"))
        for suite, cells in run["results"].items():
            if suite in ("ppl", "passkey"):
                field = "perplexity" if suite == "ppl" else "accuracy"
                for length in sorted(cells, key=int):
                    cell = cells[length]
                    value = f"{cell[field]:.4g}" if field in cell else f"skipped ({cell.get('skipped', '?')[:60]})"
                    lines.append(f"| {label} | {suite} @ {length} | {value} |")
            elif suite == "sst2":
                lines.append(f"| {label} | sst2 accuracy / F1 | {cells['accuracy']:.4f} / {cells['f1']:.4f} |")
            else:
                for length in sorted(cells, key=int):
                    lines.append(f"| {label} | {suite} @ {length} digits | {cells[length]:.3f} |")
    table = "\n".join(lines)
    (out / "compare.md").write_text(table + "\n")
    (out / "compare.json").write_text(json.dumps({"runs": runs}, indent=2, default=str))
    plot_results(runs, out)
    return table
