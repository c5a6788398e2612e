"""Install the stacks of a plan (`hf_posenc.plan`): a model's one stack is the model itself; an encoder-decoder's
are each installed as a model of their own (`sites.model`, `sites.layers`), every change into one `PatchState`,
and attention the patch gives no positions (cross-attention, the self-attention of a stack left alone) is marked
to run the stock attention."""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from ..adapters.probes import takes_kwargs
from ..attention import PREFIX
from ..config import STACKS
from ..seq2seq import cross_attentions, self_attentions, stack_module
from ..state import PatchState, RemoveHooks
from .base import PatchHook
from .entry import Stack
from .layers import install as install_layers
from .model import install as install_model


class Unpositioned(PatchHook):
    """Forward pre-hook on an attention module the patch gives no positions (cross-attention, or the
    self-attention of a stack left alone): the patch's private kwargs, handed down the blocks, stop here, and the
    module runs the stock attention it dispatches to."""

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        return args, {k: v for k, v in kwargs.items() if not k.startswith(PREFIX)}


def install(model: nn.Module, stacks: Sequence[Stack], state: PatchState) -> None:
    """Install every planned stack of `model`, recording every change in `state`."""
    if stacks[0].name is None:
        install_stack(model, stacks[0], state)
        return
    names = {id(m): n for n, m in model.base_model.named_modules()}
    state.undo.append(RemoveHooks(model, PatchHook))
    for stack in stacks:
        module = stack_module(model, stack.name)
        before = len(state.new_modules)
        install_stack(module, stack, state)
        prefix = names[id(module)]
        state.new_modules[before:] = [f"{prefix}.{p}" if prefix else p for p in state.new_modules[before:]]
    adapters = {stack.name: stack.adapter for stack in stacks}
    for name in STACKS:
        if (module := stack_module(model, name)) is None:
            continue
        adapter = adapters.get(name)
        plain = cross_attentions(module, adapter) if adapter else self_attentions(module)
        # a module whose forward takes no **kwargs does not call attention through ALL_ATTENTION_FUNCTIONS
        # (LED's): posenc attention never runs for it, and the marker would be an unexpected argument
        for attention in filter(takes_kwargs, plain):
            attention.register_forward_pre_hook(Unpositioned(), with_kwargs=True, prepend=True)


def install_stack(module: nn.Module, stack: Stack, state: PatchState) -> None:
    """One stack: its per-layer map, or its one entry over every layer."""
    if stack.per_layer:
        install_layers(module, stack.adapter, stack.entries, state)
    else:
        install_model(module, stack.entries[0], state)
