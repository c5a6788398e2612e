"""What a recipe's `task` changes in the one training flow, as one registry entry per task.

The runner calls the entry of its task: the trainer it runs on, which models it takes (checked from the config, before any
weights load), how rows are made (`inputs.prepare_*`), the per-sample held-out scores of a batch's logits (Trainer's
`preprocess_logits_for_metrics`: it gathers them over processes), the metric tables those scores make (named and
described in results.json by `hf_posenc.evaluation.held_out`), and the held-out loss the plots use. A new task is one more entry, not a branch in the loop.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
import transformers

from ..errors import PosEncError
from ..evaluation import classification, held_out, perplexity_by_length
from ..stats import rate_fields
from . import inputs
from .recipe import Recipe
from .trainer import PosEncSeq2SeqTrainer, PosEncSFTTrainer, PosEncTrainer, PositionalPieces

Scores = dict[str, torch.Tensor]  # name -> one value per sample of the batch
Tables = dict[str, dict[str, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Task:
    """One `task`: see the module docstring. `encoder_decoder` is what the model's config must say
    (None: either); `original` scores the model before the swap too (a new head has nothing to compare)."""

    prepare: Callable[[Recipe, Any, Any], inputs.Prepared]
    scores: Callable[[torch.Tensor, torch.Tensor], Scores]  # (logits, labels) -> per-sample scores
    tables: Callable[[torch.nn.Module, Scores, Recipe, inputs.Prepared, Any], Tables]
    held_out_loss: Callable[[Recipe, Tables], float]
    trainer: type[PositionalPieces]  # the library's trainer it runs on, with its arguments class
    encoder_decoder: bool | None = None
    original: bool = False
    head: str = "causal_lm"  # the `hf_posenc.loading` task whose Auto class loads the model


def _lm_scores(logits: torch.Tensor, labels: torch.Tensor) -> Scores:
    logits = logits.float()
    return {"loss": F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], reduction="none").mean(dim=1)}


def _lm_tables(model: torch.nn.Module, scores: Scores, recipe: Recipe, data: inputs.Prepared, tokenizer: Any) -> Tables:
    """Perplexity of the held-out blocks at the training length, then `perplexity_by_length` on the
    held-out text at `perplexity_lengths` (every rank scores its share: FSDP's forwards are collective)."""
    e, d = recipe.posenc, recipe.data
    loss, samples = scores["loss"].mean().item(), scores["loss"].numel()
    table = perplexity_by_length(model, data.eval_ids, e.perplexity_lengths, max_windows=e.eval_max_windows,
                                 mode="sliding", distributed=True) if e.perplexity_lengths else {}
    table[d.seq_len] = {"perplexity": math.exp(loss), "loss": loss, "tokens": samples * (d.seq_len - 1),
                        "windows": samples, "stride": d.seq_len}
    return {held_out.table("causal_lm"): {str(k): v for k, v in sorted(table.items())}}


def _classifier_scores(logits: torch.Tensor, labels: torch.Tensor) -> Scores:
    return {"loss": F.cross_entropy(logits.float(), labels, reduction="none")}


def _classifier_tables(model: torch.nn.Module, scores: Scores, recipe: Recipe, data: inputs.Prepared,
                       tokenizer: Any) -> Tables:
    """The held-out rows' accuracy and F1 (`hf_posenc.evaluation.classification`) with their mean loss."""
    d = recipe.data
    cell = classification(model, tokenizer, data.eval_raw, text_column=d.text_column, label_column=d.label_column,
                          batch_size=recipe.training.per_device_eval_batch_size, distributed=True)
    return {held_out.table("classification"): {d.dataset_name: {**cell, "loss": scores["loss"].mean().item()}}}


def _seq2seq_scores(logits: torch.Tensor, labels: torch.Tensor) -> Scores:
    """Summed token loss, scored tokens and exact match of each row, labels through the decoder.

    Exact match is the teacher-forced argmax equalling every label token: then greedy decoding, which
    feeds back its own (here the true) tokens, produces exactly the labels up to their end-of-sequence
    token, and conversely, so this is greedy generation's exact match at the cost of one forward pass.
    """
    logits = logits.float()  # the model shifted the labels into its decoder inputs
    scored = labels != inputs.IGNORE_INDEX
    loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=inputs.IGNORE_INDEX, reduction="none")
    exact = ((logits.argmax(-1) == labels) | ~scored).all(dim=1)
    return {"loss_sum": loss.sum(dim=1), "tokens": scored.sum(dim=1).float(), "exact": exact.float()}


def _completion_scores(logits: torch.Tensor, labels: torch.Tensor) -> Scores:
    """As `_seq2seq_scores` for a causal LM: each position predicts the next token, and only the completion's
    tokens are labelled, so a row is exact when every completion token is the argmax after its prefix."""
    labels, logits = labels[:, 1:], logits[:, :-1].float()
    scored = labels != inputs.IGNORE_INDEX
    loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=inputs.IGNORE_INDEX, reduction="none")
    exact = ((logits.argmax(-1) == labels) | ~scored).all(dim=1)
    return {"loss_sum": loss.sum(dim=1), "tokens": scored.sum(dim=1).float(), "exact": exact.float()}


def _answer_tables(task: str) -> Callable[..., Tables]:
    """The table of `task` (`evaluation.held_out`): per-token held-out loss and the rows' exact match (greedy decoding's, see
    `_seq2seq_scores`), with n and its 95% Wilson interval."""

    def tables(model: torch.nn.Module, scores: Scores, recipe: Recipe, data: inputs.Prepared, tokenizer: Any) -> Tables:
        tokens, hits, n = scores["tokens"].sum().item(), scores["exact"].sum().item(), scores["exact"].numel()
        loss = scores["loss_sum"].sum().item() / tokens
        cell = {"exact_match": hits / n, **rate_fields(round(hits), n), "loss": loss, "perplexity": math.exp(loss),
                "tokens": int(tokens)}
        return {held_out.table(task): {recipe.data.dataset_name: cell}}

    return tables


def _loss(key: Callable[[Recipe], Any]) -> Callable[[Recipe, Tables], float]:
    """The held-out loss of a recipe's tables: its task's table, at the `key` of the recipe."""
    return lambda recipe, tables: tables[held_out.table(recipe.model.task)][str(key(recipe))]["loss"]


TRAINING_TASKS: dict[str, Task] = {
    "causal_lm": Task(inputs.prepare_lm, _lm_scores, _lm_tables, _loss(lambda r: r.data.seq_len), PosEncSFTTrainer,
                      encoder_decoder=False, original=True),
    "classification": Task(inputs.prepare_classification, _classifier_scores, _classifier_tables,
                           _loss(lambda r: r.data.dataset_name), PosEncTrainer, head="classification"),
    "seq2seq": Task(inputs.prepare_seq2seq, _seq2seq_scores, _answer_tables("seq2seq"),
                    _loss(lambda r: r.data.dataset_name), PosEncSeq2SeqTrainer, encoder_decoder=True, head="seq2seq"),
    "prompt_completion": Task(inputs.prepare_completion, _completion_scores, _answer_tables("prompt_completion"),
                              _loss(lambda r: r.data.dataset_name), PosEncSFTTrainer, encoder_decoder=False),
}
# task -> the transformers Auto classes' model types it loads (None: the class decides at load)
_MAPPINGS = {"seq2seq": transformers.models.auto.modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}


def prepare(recipe: Recipe, raw: Any, tokenizer: Any) -> inputs.Prepared:
    """Tokenize the raw data as the recipe's task does."""
    return TRAINING_TASKS[recipe.model.task].prepare(recipe, raw, tokenizer)


def check_model(recipe: Recipe, config: transformers.PretrainedConfig) -> None:
    """A model the task cannot train is a recipe error naming its type, raised before loading weights:
    seq2seq needs an encoder-decoder (labels go through its decoder), causal_lm a decoder-only model."""
    task, name = recipe.model.task, recipe.model.model_name_or_path
    wants = TRAINING_TASKS[task].encoder_decoder
    model_type = config.model_type
    is_pair = bool(getattr(config, "is_encoder_decoder", False))
    mapping = _MAPPINGS.get(task)
    if wants is True and not (is_pair and (mapping is None or model_type in mapping)):
        raise PosEncError(f"{recipe.source}: task: 'seq2seq' trains encoder-decoder models "
                          f"(AutoModelForSeq2SeqLM: t5, bart, marian, ...); {name!r} is a {model_type!r} model, "
                          "which is not one; use task: causal_lm")
    if wants is False and is_pair:
        raise PosEncError(f"{recipe.source}: task: {task!r} trains decoder-only models; {name!r} is a "
                          f"{model_type!r} encoder-decoder model: use task: seq2seq")
