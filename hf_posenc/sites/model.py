"""Install a scheme into one model (or one stack of an encoder-decoder model): the parts every scheme shares
(the layer-loop hook, the kwargs relays, the recorded config and save), then the site installer of the scheme."""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable

from torch import nn

from .. import compat, saving
from ..adapters.base import Adapter
from ..config import BEFORE
from ..schemes.base import ModelFacts, Scheme, rederive_buffers
from ..state import Missing, PatchState, RemoveHooks, Restore
from . import INSTALLERS
from .base import CarryKwargs, HandSlotIds, KeepPositionIds, LayerLoop, PatchHook, RecordPositions, RelayKwargs


def install(model: nn.Module, adapter: Adapter, spec: Scheme, facts: ModelFacts, state: PatchState,
            site: Callable[..., None] | None = None) -> None:
    """Install `spec` into `model` where `adapter` says, every change recorded in `state` (`state.config` resolved);
    `site`: an installer other than the scheme's site's (a per-layer rotation, `sites.layers`)."""
    base, config = model.base_model, model.config
    owner = base.get_submodule(adapter.loop) if adapter.loop else base
    offset = adapter.ids_offset(compat.text_config(config))
    state.undo.append(RemoveHooks(base, PatchHook))
    state.set_attr(config, "posenc", state.config.to_dict(original=adapter.native))
    # the folders it saves load back patched, never as the stock model (saving.py)
    state.set_attr(model, "save_pretrained", functools.partial(saving.save_pretrained, model), instance=True)
    own_init(model, state)
    if (max_positions := spec.max_positions(state.config.options)) is not None:
        state.set_attr(compat.text_config(config), adapter.positions_field, max_positions + offset)
    loop = LayerLoop(spec.name, list(inspect.signature(owner.forward).parameters), offset,
                     bool(adapter.position_slot) and not adapter.slot_hooked, adapter.token_type_ids,
                     carry=adapter.from_loop(adapter.layers) if adapter.carry_kwargs else None)
    if adapter.position_slot and adapter.slot_hooked and not adapter.native_slot:  # a kept slot takes its own call
        loop.contributions.append(HandSlotIds(adapter.from_loop(adapter.position_slot), facts.position_offset))
    (site or INSTALLERS[spec.site])(model, adapter, spec, facts, state, loop)
    if loop.needed:
        owner.register_forward_pre_hook(loop, with_kwargs=True)
        relay = RelayKwargs if adapter.relay_kwargs else CarryKwargs if adapter.carry_kwargs else None
        for block in adapter.attention_blocks(model) if relay else ():
            block.register_forward_pre_hook(relay(adapter.attention), with_kwargs=True)
        if model is not base and drops_position_ids(model, base):
            state.undo.append(RemoveHooks(model, PatchHook))
            model.register_forward_pre_hook(KeepPositionIds(adapter.loop), with_kwargs=True)
    if loop.key_positions:
        owner.register_forward_hook(RecordPositions(), with_kwargs=True)
    # what saving asks: plain transformers rebuilds the model from its config alone when the patch left the
    # model's own rotary module in place (rebuilt from new `rope_parameters`), which no hook, bias or weight does
    state.native = adapter.rotary is not None and \
        type(base.get_submodule(adapter.rotary)).__module__.startswith("transformers.")
    if state.native:
        record_before(config, state)


def initialize_weights(model: nn.Module) -> None:
    """A patched model's `initialize_weights` (what `init_weights` and transformers' loading call): the class's
    own, then the buffers of the patch's modules, which the class's init does not know (a model built on the meta
    device has them empty after `to_empty`)."""
    type(model).initialize_weights(model)
    rederive_buffers(model)
    for module in model.modules():  # the rotary modules the patch put in, as transformers' own
        if isinstance(module, compat.rotary_module_class()):
            compat.rederive_rotary(module)


def own_init(model: nn.Module, state: PatchState) -> None:
    """Route `model`'s own init (a transformers model's: a stack of some encoder-decoders is not one) through
    `initialize_weights`."""
    if callable(getattr(type(model), "initialize_weights", None)):
        state.set_attr(model, "initialize_weights", functools.partial(initialize_weights, model), instance=True)


def record_before(config: Any, state: PatchState) -> None:
    """Put what the native patch changed in the model's (text) config, as it was, into `config.posenc`: the folder
    then loads in hf-posenc as the model before the patch, patched again, and `unpatch` gives the stock positions
    back (with only the patched fields, the loaded model's "stock" would be the patched one)."""
    text = compat.text_config(config)
    before = {r.name: copy.deepcopy(r.held) for r in state.undo
              if isinstance(r, Restore) and r.obj is text and r.name != "posenc" and r.held is not Missing}
    state.set_attr(config, "posenc", {**config.posenc, BEFORE: before})


def drops_position_ids(model: nn.Module, base: nn.Module) -> bool:
    """The model's forward takes position_ids only into **kwargs and its base model has no such argument
    (BLOOM): explicit positions would never reach the layer-loop hook."""
    outer, inner = (inspect.signature(type(m).forward).parameters for m in (model, base))
    return "position_ids" not in outer and "position_ids" not in inner and \
        any(p.kind is p.VAR_KEYWORD for p in outer.values())
