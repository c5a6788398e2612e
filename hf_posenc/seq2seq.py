"""Encoder-decoder models (T5, BART, Marian, Pegasus, M2M100, Whisper's decoder) and speech LMs (an audio tower
feeding a decoder-only LM: Voxtral, Qwen2-Audio, ...): two stacks, one patch.

Each stack is a transformers model of its own (`get_encoder()`, `get_decoder()`: BartEncoder, T5Stack, ...),
with its layer loop, its position slot or bucket table, and its own source of positions (the encoder's
from its mask, the decoder's from its mask, cache or explicit ids). So each stack is discovered and
planned exactly as a single-stack model is, with the encoder read as bidirectional and the decoder as
causal. `hf_posenc.view` reads the stacks (which read text, their modules, their adapters), `hf_posenc.plan`
plans a patch of them and `hf_posenc.sites.stacks` installs it, every change into ONE `PatchState`: `unpatch` is
bit-exact and `describe` gives one config. This module holds what the installers ask of the stacks besides.
Cross-attention is left as it was: its keys carry no position, so a q/k scheme never touches it (its q/k
projections are not the self-attention's), and under a biased attention implementation its calls are
marked to run the stock attention (`sites.stacks.Unpositioned`). T5's bias is computed once per stack (one
bias module on each loop owner, its mask shared by the layers within a forward), as T5 does. Which stacks
read text is read off the instance: a stack without a 2-D token embedding table (an audio tower) is left
as it is.
"""

from __future__ import annotations

from torch import nn

from .adapters.base import Adapter, get_module
from .adapters.discover import CROSS, holds_qk
from .view import is_seq2seq, not_text, read, stack_module, text_stacks


def stack_adapter(model: nn.Module, stack: str) -> Adapter:
    """The adapter of one stack of an encoder-decoder model (read once per config, as the model was before any
    patch: `hf_posenc.view.read`), or PosEncError saying why that stack is out of scope."""
    return read(model).adapter(stack)


def self_attentions(stack: nn.Module) -> list[nn.Module]:
    """Every attention module of a stack the patch leaves alone (only consulted when its config is shared)."""
    return [m for m in stack.modules() if holds_qk(m)]


def cross_attentions(stack: nn.Module, adapter: Adapter) -> list[nn.Module]:
    """Attention modules of the stack's blocks other than the self-attention (found by discovery's names)."""
    blocks = get_module(stack, adapter.blocks.layers)
    return [m for block in blocks for n, m in block.named_modules()
            if n and any(c == n.rsplit(".", 1)[-1] for c in CROSS)]


__all__ = ["cross_attentions", "is_seq2seq", "not_text", "self_attentions", "stack_adapter", "stack_module",
           "text_stacks"]
