"""Downstream tasks: length generalisation on synthetic tasks, and sentiment classification."""

from __future__ import annotations

import functools
from typing import Any

import datasets
import evaluate
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import PosEncError
from ..progress import bar
from ..seq2seq import is_seq2seq
from ..stats import rate_fields
from .processes import across_processes
from .scoring import (
    CAUSAL_LM_CLASSES,
    CLASSIFIER_CLASSES,
    MASKED_LM_CLASSES,
    device,
    greedy_answers,
    load_metric,
    logits,
    output_head,
    padded_hidden,
    require_pad,
)

# Zero-shot sentiment for causal LMs: compare the next-token scores of two label words
# (the "verbalizer" of Schick & Schuetze 2021; prompting as in Brown et al. 2020).
SENTIMENT_PROMPT = "Review: {text}\nSentiment (positive or negative):"
SENTIMENT_WORDS = (" negative", " positive")


def length_generalization(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: datasets.Dataset,
    *,
    prefix: str = "",
    batch_size: int = 8,
    progress: bool = False,
    distributed: bool = False,
) -> dict[str, Any]:
    """Exact-match accuracy by task length on a synthetic task (see `hf_posenc.data.synthetic_task`).

    Args:
        dataset: columns `prompt`, `target`, `length`.
        prefix: text put before every prompt (few-shot examples for a model not trained on the task).
        batch_size: prompts per forward pass (> 1 needs a pad token).
        distributed: split the prompts over the processes (see `processes.across_processes`).
    Returns:
        {"exact_match": float, "by_length": {length: float}}.
    """
    missing = {"prompt", "target", "length"} - set(dataset.column_names)
    if missing:
        raise PosEncError(f"the dataset lacks columns {sorted(missing)}; build it with hf_posenc.data.synthetic_task")
    predictions = greedy_answers(model, tokenizer, [prefix + p for p in dataset["prompt"]], dataset["target"],
                                 batch_size=batch_size, desc="length generalisation", progress=progress,
                                 distributed=distributed)
    return load_metric("length_generalization").compute(
        predictions=predictions, references=dataset["target"], lengths=dataset["length"]
    )


def seq2seq_length_generalization(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: datasets.Dataset,
    *,
    batch_size: int = 8,
    progress: bool = False,
    distributed: bool = False,
) -> dict[str, Any]:
    """Exact match by task length of an encoder-decoder that reads each input and generates its output.

    The encoder gets the input, the decoder generates greedily (`generate`, no sampling, one beam, no
    repetition rules) until end-of-sequence or the target's token count + 1; whitespace is ignored in the
    comparison (the digits are the answer, however a tokenizer spaces them when decoding).

    Args:
        dataset: columns `input`, `target`, `length` (see `hf_posenc.data.seq2seq_pairs`).
        batch_size: inputs per `generate` call (> 1 needs a pad token).
        distributed: split the inputs over the processes (see `processes.across_processes`).
    Returns:
        {"exact_match": float, "by_length": {length: float}, "predictions": [str, ...]}.
    """
    missing = {"input", "target", "length"} - set(dataset.column_names)
    if missing:
        raise PosEncError(f"the dataset lacks columns {sorted(missing)}; build it with hf_posenc.data.seq2seq_pairs")
    if not is_seq2seq(model):
        raise PosEncError(f"{type(model).__name__} is not an encoder-decoder model: the seq2seq tasks need one "
                          "(AutoModelForSeq2SeqLM: T5, BART, ...); score a causal LM with the copy/reverse/addition tasks")
    if batch_size > 1:
        require_pad(tokenizer)
    rows = list(zip(dataset["input"], dataset["target"]))

    def generate(part: list[tuple[str, str]]) -> list[str]:
        out = []
        shown = bar(range(0, len(part), batch_size), desc="seq2seq length generalisation", unit="batch", show=progress)
        for i in shown:
            chunk = part[i : i + batch_size]
            enc = tokenizer([source for source, _ in chunk], padding=True, return_tensors="pt").to(device(model))
            longest = max(len(ids) for ids in tokenizer(text_target=[t for _, t in chunk])["input_ids"])
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=longest + 1, do_sample=False, num_beams=1,
                                     no_repeat_ngram_size=0, repetition_penalty=1.0)
            out += tokenizer.batch_decode(ids, skip_special_tokens=True)
        return out

    predictions = across_processes(rows, generate, distributed)
    scores = load_metric("length_generalization").compute(
        predictions=["".join(p.split()) for p in predictions], references=["".join(t.split()) for _, t in rows],
        lengths=dataset["length"])
    return {**scores, "predictions": predictions}


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
    distributed: bool = False,
) -> dict[str, Any]:
    """Binary sentiment accuracy and F1 of a sequence classifier, or zero-shot for a causal LM.

    A `*ForSequenceClassification` model predicts the argmax of its logits; a causal LM predicts
    the label word (" negative" / " positive") it scores higher after a review prompt.
    `distributed` splits the texts over the processes (see `processes.across_processes`).
    Returns {"accuracy", "f1", "examples", "mode" ("classifier" or "zero-shot"), "n", "low", "high" (the
    accuracy's 95% Wilson interval)}.
    """
    for column in (text_column, label_column):
        if column not in dataset.column_names:
            raise PosEncError(
                f"the dataset has no column {column!r}; its columns are {dataset.column_names}. "
                "Pass text_column= / label_column= naming the right ones."
            )
    require_pad(tokenizer)
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

    def predict_all(part: list[str]) -> list[int]:
        shown = bar(range(0, len(part), batch_size), desc=f"classification ({mode})", unit="batch", show=progress)
        return [label for i in shown for label in predict(part[i : i + batch_size])]

    predictions = across_processes(texts, predict_all, distributed)
    scores = evaluate.combine([load_metric("accuracy"), load_metric("f1")]).compute(
        predictions=predictions, references=labels
    )
    n = len(labels)
    return {**scores, "examples": n, "mode": mode, **rate_fields(round(scores["accuracy"] * n), n)}


def _classifier_predict(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[int]:
    # truncation to the tokenizer's model_max_length (512 for BERT-family tokenizers), as in fine-tuning
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(device(model))
    with torch.no_grad():
        return model(**enc).logits.argmax(-1).tolist()


def _zero_shot_predict(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[int]:
    """The label word the model scores higher right after the prompt. Tokens the label words share
    (e.g. a leading space under a character tokenizer) are appended to the prompt first, and the
    words compared at their first differing token."""
    head = output_head(model)
    words = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in SENTIMENT_WORDS]
    shared = 0
    while shared < min(map(len, words)) - 1 and words[0][shared] == words[1][shared]:
        shared += 1
    if words[0][shared] == words[1][shared]:
        raise PosEncError(f"the tokenizer cannot tell the label words {SENTIMENT_WORDS} apart")
    rows = [tokenizer(SENTIMENT_PROMPT.format(text=t))["input_ids"] + words[0][:shared] for t in texts]
    hidden = padded_hidden(model, head, rows, tokenizer.pad_token_id)
    last = torch.tensor([len(r) - 1 for r in rows], device=hidden.device)
    scores = logits(head, hidden[torch.arange(len(rows), device=hidden.device), last])
    return scores[:, [words[0][shared], words[1][shared]]].argmax(-1).tolist()
