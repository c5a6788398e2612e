"""How a scheme's module joins a model: built from its options and the model's facts, then placed on the model's
device in its dtype. What every site installer does with the module a scheme gives (`hf_posenc.sites`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import ModelFacts, Scheme


def built(spec: Scheme, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
    """`spec`'s module for this model, placed. Built on the CPU whatever the default device: on a model made on the
    meta device its init reads stand-ins of the model's tables, and the module then joins the model on meta, where
    loading or `init_weights` gives it its values."""
    with torch.device("cpu"):
        module = spec.module(options, facts)
    return place(module, facts)


def place(module: nn.Module, facts: ModelFacts) -> nn.Module:
    """A scheme's module as every site installs it: on the model's device, its parameters in the model's dtype
    (the model stays one dtype: FSDP, `model.dtype`), its buffers in the dtype the scheme built them in. Those
    hold frequencies, slopes and decays in fp32, as a stock model loaded in bf16 keeps its `inv_freq`: bf16
    frequencies turn position 512 by 0.9 rad at theta 5e5 (or the model's dtype, where they only name it)."""
    module.to(facts.device)
    for param in module.parameters():
        param.data = param.data.to(facts.dtype)
    return module


__all__ = ["built", "place"]
