"""Encoder-decoder models (T5, BART, Marian, Pegasus, M2M100, Whisper's decoder) and speech LMs (an audio tower
feeding a decoder-only LM: Voxtral, Qwen2-Audio, ...): two stacks, one patch.

Each stack is a transformers model of its own (`get_encoder()`, `get_decoder()`: BartEncoder, T5Stack, ...),
with its layer loop, its position slot or bucket table, and its own source of positions (the encoder's
from its mask, the decoder's from its mask, cache or explicit ids). So each stack is discovered and
planned exactly as a single-stack model is, with the encoder read as bidirectional and the decoder as
causal. This module finds the stacks, beside the adapters; `hf_posenc.plan` plans a patch of them and
`hf_posenc.sites.stacks` installs it, every change into ONE `PatchState`: `unpatch` is bit-exact and `describe`
gives one config.
Cross-attention is left as it was: its keys carry no position, so a q/k scheme never touches it (its q/k
projections are not the self-attention's), and under a biased attention implementation its calls are
marked to run the stock attention (`sites.stacks.Unpositioned`). T5's bias is computed once per stack (one
bias module on each loop owner, its mask shared by the layers within a forward), as T5 does. Which stacks
read text is read off the instance: a stack without a 2-D token embedding table (an audio tower) is left
as it is.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from torch import nn

from . import compat
from .adapters.base import Adapter, get_module
from .adapters.discover import CROSS, discover, holds_qk
from .adapters.generic import adapter_from
from .adapters.meta import ConfigCache, meta_model
from .config import STACKS
from .errors import PosEncError


def is_seq2seq(model: Any) -> bool:
    """An instance with two stacks: an encoder-decoder model (a config alone says True for BART's causal LM
    too), or a speech LM whose own text decoder reads what an audio tower encodes (Voxtral, Qwen2-Audio, ...)."""
    config = getattr(model, "config", None)
    if not (isinstance(model, nn.Module) and callable(getattr(model, "get_encoder", None))
            and callable(getattr(model, "get_decoder", None))):
        return False
    if getattr(config, "is_encoder_decoder", False):
        return True
    decoder = model.get_decoder()
    own_decoder = decoder is not model and decoder is not model.base_model and _token_table(decoder)
    return bool(own_decoder) and compat.encoder_module(model) is not None and not_text(model, "encoder") is not None


def stack_module(model: nn.Module, stack: str) -> nn.Module | None:
    """The stack's module; None for an encoder side the model does not have as a module of its own."""
    return compat.encoder_module(model) if stack == "encoder" else model.get_decoder()


def not_text(model: nn.Module, stack: str) -> str | None:
    """Why a stack's positions are out of scope, read off the instance: no module of its own, or no 2-D token
    embedding table (an audio tower reads features through convolutions: its positions are those of frames,
    not of tokens); None for a text stack."""
    module = stack_module(model, stack)
    if module is None:
        return "the model has no encoder module of its own (get_encoder() returns the model itself)"
    if getattr(module, "config", None) is None or _token_table(module):  # no config: stack_adapter says why
        return None
    reads = next(iter(inspect.signature(module.forward).parameters), "?")
    return (f"{type(module).__name__} has no token embedding table: it reads {reads!r} (features, not token ids), "
            "whose positions are those of audio frames, not of tokens")


def _token_table(module: nn.Module) -> bool:
    try:
        weight = getattr(module.get_input_embeddings(), "weight", None)
    except (NotImplementedError, AttributeError):  # transformers' default refuses stacks it cannot read
        return False
    return isinstance(weight, torch.Tensor) and weight.dim() == 2


def text_stacks(model: nn.Module) -> tuple[str, ...]:
    """The stacks a patch takes by default: those that read text."""
    return tuple(s for s in STACKS if not_text(model, s) is None)


# discovery runs once per model and stack
CACHE: ConfigCache[Adapter] = ConfigCache()


def stack_adapter(model: nn.Module, stack: str) -> Adapter:
    """The generic adapter of one stack, read off that stack as a model of its own; the encoder is
    bidirectional and the decoder causal whatever the shared config says."""
    if (reason := not_text(model, stack)) is not None:
        raise PosEncError(f"{model.config.model_type!r}: the {stack} stack is out of scope ({reason}); patch "
                          f"stacks={list(text_stacks(model))}")
    if (cached := CACHE.get(model.config, stack)) is not None:
        return cached
    # a patched model (a deepcopy, a reload) is read from its stock structure
    source = model if getattr(model.config, "posenc", None) is None else meta_model(model.config, type(model))
    module = stack_module(source, stack)
    if getattr(module, "config", None) is None:
        raise PosEncError(f"{model.config.model_type!r}: the {stack} stack ({type(module).__name__}) is a plain "
                          "nn.Module without a config, not a transformers model discovery can read on its own")
    try:
        structure = discover(module, stack)
    except (NotImplementedError, AttributeError, TypeError, RuntimeError) as exc:  # a stack that is no text model
        raise PosEncError(f"{model.config.model_type!r}: the {stack} stack is not a model discovery can read "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    adapter = dataclasses.replace(adapter_from(structure), causal=stack == "decoder")
    return CACHE.put(model.config, adapter, stack)


def self_attentions(stack: nn.Module) -> list[nn.Module]:
    """Every attention module of a stack the patch leaves alone (only consulted when its config is shared)."""
    return [m for m in stack.modules() if holds_qk(m)]


def cross_attentions(stack: nn.Module, adapter: Adapter) -> list[nn.Module]:
    """Attention modules of the stack's blocks other than the self-attention (found by discovery's names)."""
    blocks = get_module(stack, adapter.layers)
    return [m for block in blocks for n, m in block.named_modules()
            if n and any(c == n.rsplit(".", 1)[-1] for c in CROSS)]


__all__ = ["cross_attentions", "is_seq2seq", "not_text", "self_attentions", "stack_adapter", "stack_module",
           "text_stacks"]
