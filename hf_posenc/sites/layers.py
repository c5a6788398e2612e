"""Per-layer patches: each entry's scheme in its own attention layers, the model's own positions in the rest.

An entry installs like a whole-model patch through a *view* of the adapter (`view`) that sees only its layers
and none of the model-wide positions the other layers still use: the model's rotary module stays, and the
position slot keeps the model's own table (fed the patch's padding-aware positions) unless the patch covers
every layer (then, as a whole-model patch, it takes the slot away). On a natively rotating model a q/k entry
gets the rotation the whole-model patch would put in the rotary slot, computed once per forward and handed to
its layers in place of their `position_embeddings` (so the model's own rotation layout, partial or per-head
normed, is kept). One `LayerRole` hook per attention module then does what only a layer knows: which rotation
it uses, and whether it runs the stock attention without the patch's private kwargs.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn

from .. import compat
from ..attention import BIAS_KWARG, LOGITS_KWARG, POSITIONS_KWARG, PREFIX
from ..errors import PosEncError
from ..schemes.rope import native_partial
from ..schemes.building import place
from .base import LayerLoop, PatchHook
from .entry import Entry
from .qk import ROTARY_KWARG, ROTARY_MODULE, RotaryKwarg, layer_parameters
from .table import site_refusal

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..schemes.base import ModelFacts, Scheme
    from ..state import PatchState

ROTATION_KWARG = "position_embeddings"  # what a natively rotating attention module rotates q and k by
POSENC_ATTENTION = ("score", "attention")  # sites whose scheme runs inside the posenc attention function
ATTENTION_KWARGS = (POSITIONS_KWARG, BIAS_KWARG, LOGITS_KWARG)  # the private kwargs the posenc attention reads
IDENTITY = ""  # LayerRole.rotation: cos = 1, sin = 0


def view(adapter: Adapter, layers: Sequence[int], owns: bool) -> Adapter:
    """The adapter as one entry's installers see it: only `layers` attend with the entry's positions, the
    model's rotary module stays for the others, and the bias table and bias switch shared by every layer are the
    entry's to remove only when the patch covers every layer (`owns`: given to the first entry, which then also
    takes the position slot away, `Entry.keeps_slot`). Its `Entry.tag` keeps the modules and private kwargs of two
    entries of the same site apart."""
    return dataclasses.replace(
        adapter, blocks=dataclasses.replace(adapter.blocks, attention_layers=tuple(layers)), rotation=None,
        bias=adapter.bias if owns else dataclasses.replace(adapter.bias, table=None, switch=None),
    )


def rotation_module(model: nn.Module, adapter: Adapter, spec: Scheme, options: dict[str, Any],
                    facts: ModelFacts) -> nn.Module:
    """What the whole-model patch puts in the rotary slot (sites.qk): the model's own rotary class rebuilt
    from the scheme's rope_parameters, or the scheme's rotary module (another rotating fraction, a scheme no
    rope_parameters express, a rotation per layer type, whose entry rotates all its layers alike)."""
    config = compat.text_config(model.config)
    if spec.config_only and options["partial"] == native_partial(facts) and not adapter.rotation.layer_types:
        own = copy.deepcopy(config)
        own.rope_parameters = layer_parameters(spec, options, facts, compat.rope_parameters(config) or {})
        return type(model.base_model.get_submodule(adapter.rotation.module))(config=compat.with_head_dim(own))
    return spec.rotary(options, facts, facts.max_positions + facts.ids_offset)


def rotation_installer(adapter: Adapter) -> Any:
    """The site installer of a q/k entry on a natively rotating model (`adapter`: the stack's, not the entry's
    view): its rotation module on the loop owner, (cos, sin) of the loop's positions handed down as a private
    kwarg its layers' `LayerRole` takes."""

    def install(model: nn.Module, entry: Entry, state: PatchState, loop: LayerLoop) -> None:
        name = ROTARY_MODULE + entry.tag
        loop.contributions.append(RotaryKwarg(name, ROTARY_KWARG + entry.tag))
        module = place(rotation_module(model, adapter, entry.spec, entry.config.options, entry.facts), entry.facts)
        state.add_module(model.base_model, entry.adapter.at_loop(name), module, new=True)

    return install


def rotates_natively(entry: Entry, adapter: Adapter) -> bool:
    """A q/k entry on a natively rotating model: its rotation replaces the model's in its layers."""
    return adapter.rotation is not None and entry.spec.site == "qk"


def layer_refusal(model: nn.Module, adapter: Adapter, view_: Adapter, spec: Scheme, covers_all: bool,
                  keeps_slot: bool) -> str | None:
    """Why `spec` cannot go into some layers of this model (None if it can), beyond what the view's
    mechanisms say (`keeps_slot`: the entry leaves the position slot to the model's own positions)."""
    if spec.site == "input":
        return "it adds positions to the token embeddings, before every layer; per-layer schemes act in attention"
    if not covers_all and (shared := adapter.bias.table or adapter.bias.switch):
        return (f"the model computes its own position bias once for every layer ({shared}): a per-layer patch "
                "must cover every layer")
    if spec.site == "none" and not covers_all and adapter.rotation is None and adapter.bias.argument is None:
        return (f"nothing to remove: the model's positions ({adapter.native}) enter at the input, not in its layers; "
                "patch every layer, or give the other layers a scheme in the same map")
    attention = adapter.attention_modules(model)[0]
    if adapter.rotation and ROTATION_KWARG not in inspect.signature(attention.forward).parameters:
        return f"its attention takes no `{ROTATION_KWARG}` to switch its own rotation off in one layer"
    # a rotation on a rotating model goes where the whole-model patch's would (rotation_module)
    return site_refusal(adapter if adapter.rotation and spec.site == "qk" else view_, spec, keeps_slot)


def map_refusal(specs: Sequence[Scheme]) -> str | None:
    """Why the schemes of one map cannot share a model (None if they can): one runs in the attention function."""
    if len(biased := [s.name for s in specs if s.site in POSENC_ATTENTION]) > 1:
        return f"a layer map takes one scheme that runs in the attention function (score or attention site), got {biased}"
    return None


class LayerRole(PatchHook):
    """Forward pre-hook on one attention module of a per-layer patch, after the entries' own hooks.

    `rotation`: None keeps the model's own rotation; `IDENTITY` switches it off (a patched layer; a q/k
    scheme through the taps already rotated q and k); else the private kwarg whose (cos, sin) replace it,
    in the dtype of the model's own. `stock`: the layer is outside the entry that runs in the posenc attention
    function and gets the stock attention; where other layers run in it (`additive`), a bool 4-D mask reaches this
    one additive too, so every layer reads a ready mask as those do (transformers' eager attention adds a bool mask
    as 0 and 1). Private kwargs no hook of this layer consumed never reach attention."""

    def __init__(self, rotation: str | None, stock: bool, additive: bool) -> None:
        self.rotation, self.stock, self.additive = rotation, stock, additive

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        replacement = kwargs.get(self.rotation) if self.rotation else None
        keep = () if self.stock else ATTENTION_KWARGS
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith(PREFIX) or k in keep}
        mask = kwargs.get("attention_mask")
        if self.stock and self.additive and isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            dtype = (args[0] if args else kwargs["hidden_states"]).dtype
            kwargs["attention_mask"] = torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)
        if self.rotation is not None:
            if ROTATION_KWARG not in kwargs:
                raise PosEncError(f"{type(attention).__name__} was called without `{ROTATION_KWARG}` as a keyword; "
                                  "its own rotation cannot be replaced in this layer")
            cos, sin = kwargs[ROTATION_KWARG]
            if replacement is None:
                if self.rotation:
                    raise PosEncError("per-layer rotation missing: a patched attention module was called outside "
                                      "its model")
                replacement = torch.ones_like(cos), torch.zeros_like(sin)
            kwargs[ROTATION_KWARG] = tuple(t.to(cos.dtype) for t in replacement)
        return args, kwargs


def site_for(entry: Entry, adapter: Adapter) -> Any:
    """The installer of one entry of a per-layer map (`adapter`: the stack's): a q/k entry's rotation on a natively
    rotating model, else None (the scheme's own site, through the entry's view)."""
    return rotation_installer(adapter) if rotates_natively(entry, adapter) else None


def assign_roles(model: nn.Module, adapter: Adapter, entries: Sequence[Entry]) -> None:
    """Once every entry is installed through its view: one `LayerRole` per attention module."""
    rotations: dict[int, str] = {}
    if adapter.rotation is not None:
        for entry in entries:
            kwarg = ROTARY_KWARG + entry.tag if rotates_natively(entry, adapter) else IDENTITY
            rotations.update(dict.fromkeys(entry.config.layers, kwarg))
    positioned = {i for e in entries if e.spec.site in POSENC_ATTENTION for i in e.config.layers}
    blocks = list(adapter.attention_blocks(model))
    indices = adapter.blocks.attention_layers if adapter.blocks.attention_layers is not None else range(len(blocks))
    for index, block in zip(indices, blocks):
        role = LayerRole(rotations.get(index), stock=index not in positioned, additive=bool(positioned))
        block.get_submodule(adapter.blocks.attention).register_forward_pre_hook(role, with_kwargs=True)
