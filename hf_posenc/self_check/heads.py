"""How the self-check reads each kind of model: a bare base model, a head with a row per token, a pooled head.

A kind is found through transformers' own Auto mappings, most specific first; a class in none of them (a bare
model of a family the Auto classes do not map) is read as a base model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import transformers
from torch import nn


@dataclasses.dataclass(frozen=True)
class Head:
    """What one kind of model gives, for the checks.

    pooled: one output per sequence (a classifier of the first or last token, multiple choice): the checks read
    its base model's hidden states, where the positions act. A pooled output cannot say whether a padded row equals
    the row alone (BERT pools the first token, which padding moves) nor follow a cache step by step, and it needs
    inputs of its own (choices, an end-of-sequence token, a pad id).
    """

    auto: str
    pooled: bool = False

    def reads(self, model: nn.Module) -> nn.Module:
        """The module whose output the checks compare."""
        return model.base_model if self.pooled else model

    def builds(self, model_class: type, config: transformers.PretrainedConfig) -> bool:
        """This head's Auto class builds `model_class` for `config`."""
        mapping = getattr(transformers, self.auto)._model_mapping
        return mapping.get(type(config), None) is model_class


# most specific first; the first Auto class that maps the model's config to its class names its kind
HEADS = (
    Head("AutoModelForCausalLM"),
    Head("AutoModelForSeq2SeqLM"),
    Head("AutoModelForMaskedLM"),
    Head("AutoModelForSequenceClassification", pooled=True),
    Head("AutoModelForMultipleChoice", pooled=True),
    Head("AutoModelForTokenClassification"),
    Head("AutoModelForQuestionAnswering"),
    Head("AutoModelForSpeechSeq2Seq"),
)
BASE = Head("AutoModel")


def head_of(model_class: type, config: transformers.PretrainedConfig) -> Head:
    """The kind of `model_class`, read from the Auto class that builds it for `config`."""
    return next((head for head in HEADS if head.builds(model_class, config)), BASE)


def primary(output: Any) -> torch.Tensor:
    """What a model outputs first: a head's logits (a QA head's start logits), else a base model's hidden states."""
    logits = getattr(output, "logits", None)
    return (logits if logits is not None else output[0]).float()
