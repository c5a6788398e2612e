"""Install the stacks of a plan (`hf_posenc.plan`): a model's one stack is the model itself; an encoder-decoder's
are each installed as a model of their own, every change into one `PatchState`, and attention the patch gives no
positions (cross-attention, the self-attention of a stack left alone) is marked to run the stock attention. A stack
is one entry over every layer, or a per-layer map (`sites.layers`: each entry through its view, then one role
per attention module); one entry installs the parts every scheme shares (the layer-loop hook, the kwargs relays),
then the site installer of its scheme."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from torch import nn

from .. import compat
from ..adapters.probes import takes_kwargs
from ..attention import PREFIX
from ..config import STACKS
from ..seq2seq import cross_attentions, self_attentions, stack_module
from ..state import PatchState, RemoveHooks
from .base import CarryKwargs, HandSlotIds, KeepPositionIds, LayerLoop, PatchHook, RecordPositions, RelayKwargs
from .entry import Entry, StackPlan
from .layers import assign_roles, site_for
from .table import SITES


class Unpositioned(PatchHook):
    """Forward pre-hook on an attention module the patch gives no positions (cross-attention, or the
    self-attention of a stack left alone): the patch's private kwargs, handed down the blocks, stop here, and the
    module runs the stock attention it dispatches to."""

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        return args, {k: v for k, v in kwargs.items() if not k.startswith(PREFIX)}


def install(model: nn.Module, stacks: Sequence[StackPlan], state: PatchState) -> None:
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


def install_stack(module: nn.Module, stack: StackPlan, state: PatchState) -> None:
    """One stack: its per-layer map, or its one entry over every layer."""
    if not stack.per_layer:
        install_entry(module, stack.entries[0], state)
        return
    for entry in stack.entries:
        install_entry(module, entry, state, site_for(entry, stack.adapter))
    assign_roles(module, stack.adapter, stack.entries)


def install_entry(model: nn.Module, entry: Entry, state: PatchState, site: Callable[..., None] | None = None) -> None:
    """Install `entry` into `model` (a model, or one stack of an encoder-decoder) where its adapter says, every
    change recorded in `state`; `site`: an installer other than the scheme's site's (a per-layer rotation,
    `sites.layers`)."""
    adapter, spec, facts = entry.adapter, entry.spec, entry.facts
    base = model.base_model
    blocks, slot = adapter.blocks, adapter.slot
    owner = base.get_submodule(blocks.loop) if blocks.loop else base
    drops = model is not base and drops_position_ids(model, base)
    loop = LayerLoop(spec.name, list(inspect.signature(owner.forward).parameters), facts.ids_offset,
                     slot is not None and not slot.hooked, adapter.embeddings.token_type_ids,
                     carry=adapter.from_loop(blocks.layers) if blocks.carry_kwargs else None)
    if slot and slot.hooked and not entry.keeps_slot:  # a kept slot takes its own call
        loop.contributions.append(HandSlotIds(adapter.from_loop(slot.path), facts.position_offset))
    state.undo.append(RemoveHooks(base, PatchHook))
    if entry.max_positions is not None:
        state.set_attr(compat.text_config(model.config), adapter.embeddings.positions_field,
                       entry.max_positions + facts.ids_offset)
    (site or SITES[spec.site].install)(model, entry, state, loop)
    if loop.slot or loop.contributions or loop.key_positions:  # the layer loop has something to hand down
        owner.register_forward_pre_hook(loop, with_kwargs=True)
        relay = RelayKwargs if blocks.relay_kwargs else CarryKwargs if blocks.carry_kwargs else None
        for block in adapter.attention_blocks(model) if relay else ():
            block.register_forward_pre_hook(relay(blocks.attention), with_kwargs=True)
        if drops:
            state.undo.append(RemoveHooks(model, PatchHook))
            model.register_forward_pre_hook(KeepPositionIds(blocks.loop), with_kwargs=True)
    if loop.key_positions:
        owner.register_forward_hook(RecordPositions(), with_kwargs=True)


def drops_position_ids(model: nn.Module, base: nn.Module) -> bool:
    """The model's forward takes position_ids only into **kwargs and its base model has no such argument
    (BLOOM): explicit positions would never reach the layer-loop hook."""
    outer, inner = (inspect.signature(type(m).forward).parameters for m in (model, base))
    return "position_ids" not in outer and "position_ids" not in inner and \
        any(p.kind is p.VAR_KEYWORD for p in outer.values())
