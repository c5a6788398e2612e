"""Install one entry into one model (or one stack of an encoder-decoder model): the parts every scheme shares
(the layer-loop hook, the kwargs relays), then the site installer of the scheme."""

from __future__ import annotations

import inspect
from typing import Callable

from torch import nn

from .. import compat
from ..state import PatchState, RemoveHooks
from .base import CarryKwargs, HandSlotIds, KeepPositionIds, LayerLoop, PatchHook, RecordPositions, RelayKwargs
from .entry import Entry
from .table import SITES


def install(model: nn.Module, entry: Entry, state: PatchState, site: Callable[..., None] | None = None) -> None:
    """Install `entry` into `model` where its adapter says, every change recorded in `state`; `site`: an installer
    other than the scheme's site's (a per-layer rotation, `sites.layers`)."""
    adapter, spec, facts = entry.adapter, entry.spec, entry.facts
    base = model.base_model
    owner = base.get_submodule(adapter.loop) if adapter.loop else base
    drops = model is not base and drops_position_ids(model, base)
    loop = LayerLoop(spec.name, list(inspect.signature(owner.forward).parameters), facts.ids_offset,
                     bool(adapter.position_slot) and not adapter.slot_hooked, adapter.token_type_ids,
                     carry=adapter.from_loop(adapter.layers) if adapter.carry_kwargs else None)
    if adapter.position_slot and adapter.slot_hooked and not adapter.native_slot:  # a kept slot takes its own call
        loop.contributions.append(HandSlotIds(adapter.from_loop(adapter.position_slot), facts.position_offset))
    state.undo.append(RemoveHooks(base, PatchHook))
    if (max_positions := spec.max_positions(entry.config.options)) is not None:
        state.set_attr(compat.text_config(model.config), adapter.positions_field, max_positions + facts.ids_offset)
    (site or SITES[spec.site].install)(model, entry, state, loop)
    if loop.slot or loop.contributions or loop.key_positions:  # the layer loop has something to hand down
        owner.register_forward_pre_hook(loop, with_kwargs=True)
        relay = RelayKwargs if adapter.relay_kwargs else CarryKwargs if adapter.carry_kwargs else None
        for block in adapter.attention_blocks(model) if relay else ():
            block.register_forward_pre_hook(relay(adapter.attention), with_kwargs=True)
        if drops:
            state.undo.append(RemoveHooks(model, PatchHook))
            model.register_forward_pre_hook(KeepPositionIds(adapter.loop), with_kwargs=True)
    if loop.key_positions:
        owner.register_forward_hook(RecordPositions(), with_kwargs=True)


def drops_position_ids(model: nn.Module, base: nn.Module) -> bool:
    """The model's forward takes position_ids only into **kwargs and its base model has no such argument
    (BLOOM): explicit positions would never reach the layer-loop hook."""
    outer, inner = (inspect.signature(type(m).forward).parameters for m in (model, base))
    return "position_ids" not in outer and "position_ids" not in inner and \
        any(p.kind is p.VAR_KEYWORD for p in outer.values())
