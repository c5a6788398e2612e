"""Install an encoder-decoder patch planned by `hf_posenc.seq2seq`: each planned stack as a model of its own
(`sites.model.install`), every change into one `PatchState`; attention the patch gives no positions
(cross-attention, the self-attention of a stack left alone) is marked to run the stock attention."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from .. import saving
from ..adapters.probes import takes_kwargs
from ..attention import PREFIX
from ..config import STACKS
from ..schemes.base import Scheme
from ..seq2seq import StackPlan, cross_attentions, self_attentions, stack_module
from ..state import PatchState, RemoveHooks
from .base import PatchHook
from .layers import Entry
from .layers import install as install_layers
from .model import install as install_model, own_init


class Unpositioned(PatchHook):
    """Forward pre-hook on an attention module the patch gives no positions (cross-attention, or the
    self-attention of a stack left alone): the patch's private kwargs, handed down the blocks, stop here, and the
    module runs the stock attention it dispatches to."""

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        return args, {k: v for k, v in kwargs.items() if not k.startswith(PREFIX)}


def install(model: nn.Module, plan: StackPlan, spec: Scheme | None, state: PatchState,
            entries: dict[str, list[Entry]] | None = None) -> None:
    """Patch the planned stacks with `state.config` (resolved), recording every change in `state`; a per-layer
    patch brings each stack's resolved `entries` instead of one `spec`."""
    names = {id(m): n for n, m in model.base_model.named_modules()}
    state.undo.append(RemoveHooks(model, PatchHook))
    for stack, adapter in plan.adapters.items():
        module = stack_module(model, stack)
        before = len(state.new_modules)
        if entries is not None:
            install_layers(module, adapter, entries[stack], state)
        else:
            install_model(module, adapter, spec, plan.facts[stack], state)
        prefix = names[id(module)]
        state.new_modules[before:] = [f"{prefix}.{p}" if prefix else p for p in state.new_modules[before:]]
    for stack in STACKS:
        if (module := stack_module(model, stack)) is None:
            continue
        adapter = plan.adapters.get(stack)
        plain = cross_attentions(module, adapter) if adapter else self_attentions(module)
        # a module whose forward takes no **kwargs does not call attention through ALL_ATTENTION_FUNCTIONS
        # (LED's): posenc attention never runs for it, and the marker would be an unexpected argument
        for attention in filter(takes_kwargs, plain):
            attention.register_forward_pre_hook(Unpositioned(), with_kwargs=True, prepend=True)
    state.set_attr(model.config, "posenc", state.config.to_dict(original=plan.adapters[plan.first].native))
    state.set_attr(model, "save_pretrained", functools.partial(saving.save_pretrained, model), instance=True)
    own_init(model, state)
    state.native = False  # no encoder-decoder family rotates natively: every patch of one hooks or replaces
