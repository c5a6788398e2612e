"""What runs inside the wrappers and stacks around a model: peft's `modules_to_save` copies and `get_peft_model`,
an encoder-decoder's or speech LM's encoder module."""

from __future__ import annotations

import warnings
from typing import Any

import torch

def running_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module that actually runs in place of `module`: peft's `modules_to_save` wrapper runs its
    active trainable copy (the original stays inside, untouched)."""
    copies = getattr(module, "modules_to_save", None)
    active = getattr(module, "active_adapters", None)
    if isinstance(copies, torch.nn.ModuleDict) and active and active[0] in copies and not module.disable_adapters:
        return copies[active[0]]
    return module


def encoder_module(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's encoder side as a module of its own: `get_encoder()` (a text encoder, or a speech model's
    `encoder`), else its audio tower (`get_encoder(modality="audio")`, transformers 5: speech LMs that feed audio
    frames into a decoder-only LM); None when both return the model itself."""
    own = [model, getattr(model, "base_model", model)]
    found = model.get_encoder()
    if any(found is m for m in own):
        try:
            found = model.get_encoder(modality="audio")
        except TypeError:  # a model's own get_encoder() without the modality argument
            return None
    return None if any(found is m for m in own) else found



def get_peft_model(model: torch.nn.Module, config: Any) -> Any:
    """peft's `get_peft_model`, without the FutureWarning transformers 5.24 raises when peft (0.21) reads the
    deprecated `is_gradient_checkpointing` it calls on our behalf."""
    import peft

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return peft.get_peft_model(model, config)
