"""Per-layer patches: each entry's scheme in its own attention layers, the model's own positions in the rest.

An entry installs like a whole-model patch through a *view* of the adapter (`view`) that sees only its layers
and none of the model-wide positions the other layers still use: no rotary module to rebuild (the entry's
rotation, if any, rotates q and k at the projections, as on a model without rotary), and no position slot
unless the patch covers every layer (then, as a whole-model patch, it takes the slot away). One `LayerRole`
hook per attention module then does what only a layer knows: switch the model's own rotation off in a patched
layer (identity cos/sin in its `position_embeddings`), and send an unpatched layer to the stock attention with
none of the patch's private kwargs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn

from .. import compat
from ..attention import BIAS_KWARG, LOGITS_KWARG, POSITIONS_KWARG, PREFIX, UNPOSITIONED_KWARG
from ..config import LayerMap, PosEncConfig
from ..errors import PosEncError
from .base import PatchHook
from .model import install as install_model

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..schemes.base import ModelFacts, Scheme
    from ..state import PatchState

ROTATION_KWARG = "position_embeddings"  # what a natively rotating attention module rotates q and k by
POSENC_ATTENTION = ("score", "attention")  # sites whose scheme runs inside the posenc attention function
ATTENTION_KWARGS = (POSITIONS_KWARG, BIAS_KWARG, LOGITS_KWARG)  # the private kwargs the posenc attention reads


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of a per-layer patch, resolved: its scheme, its config (options resolved) and its view."""

    spec: Scheme
    config: PosEncConfig
    view: Adapter


def view(adapter: Adapter, layers: Sequence[int], tag: str, covers_all: bool) -> Adapter:
    """The adapter as one entry's installers must see it: only `layers` attend with the entry's positions,
    the model's rotary module stays for the other layers, and the model-wide position slot (which still gets
    the patch's padding-aware positions), bias table and bias switch are the entry's to remove only when the
    patch covers every layer (`covers_all`, first entry). `tag` keeps the modules and private kwargs of two
    entries of the same site apart."""
    return dataclasses.replace(
        adapter, attention_layers=tuple(layers), rotary=None, rotary_layer_types=(), tag=tag,
        native_slot=not covers_all,
        bias_table=adapter.bias_table if covers_all else None,
        native_bias_switch=adapter.native_bias_switch if covers_all else None,
    )


class LayerRole(PatchHook):
    """Forward pre-hook on one attention module of a per-layer patch, after the entries' own hooks.

    `rotation_off`: the layer belongs to an entry and the model rotates natively: its rotation becomes the
    identity (the entry's own rotation, if any, already acted on q and k). `stock`: the layer is outside the
    entry that runs in the posenc attention function: it gets the stock attention. Private kwargs no hook of
    this layer consumed (another entry's rotation) never reach the attention function."""

    def __init__(self, rotation_off: bool, stock: bool, posenc_attention: bool) -> None:
        self.rotation_off, self.stock, self.posenc_attention = rotation_off, stock, posenc_attention

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        keep = () if self.stock else ATTENTION_KWARGS
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith(PREFIX) or k in keep}
        if self.stock and self.posenc_attention:
            kwargs[UNPOSITIONED_KWARG] = True
        if self.rotation_off:
            if ROTATION_KWARG not in kwargs:
                raise PosEncError(f"{type(attention).__name__} was called without `{ROTATION_KWARG}` as a keyword; "
                                  "its own rotation cannot be switched off in this layer")
            cos, sin = kwargs[ROTATION_KWARG]
            kwargs[ROTATION_KWARG] = (torch.ones_like(cos), torch.zeros_like(sin))
        return args, kwargs


def install(model: nn.Module, adapter: Adapter, entries: list[Entry], facts: ModelFacts, state: PatchState) -> None:
    """Install every entry through its view, then one `LayerRole` per attention module; `state.config` is
    the whole patch (a PosEncConfig with layers, or a LayerMap)."""
    whole = state.config
    for entry in entries:
        state.config = entry.config  # the installers read the options of the entry they install
        install_model(model, entry.view, entry.spec, facts, state)
    state.config = whole
    state.set_attr(model.config, "posenc", whole.to_dict(original=adapter.native))
    posenc_attention = compat.attn_implementation(model.config).startswith(PREFIX)
    positioned = {i for e in entries if e.spec.site in POSENC_ATTENTION for i in e.config.layers}
    patched = {i for e in entries for i in e.config.layers}
    blocks = list(adapter.attention_blocks(model))
    indices = adapter.attention_layers if adapter.attention_layers is not None else range(len(blocks))
    for index, block in zip(indices, blocks):
        role = LayerRole(rotation_off=adapter.rotary is not None and index in patched,
                         stock=index not in positioned, posenc_attention=posenc_attention)
        block.get_submodule(adapter.attention).register_forward_pre_hook(role, with_kwargs=True)
    state.native = False  # hooks, never config alone


def entries_of(patch: PosEncConfig | LayerMap) -> tuple[PosEncConfig, ...]:
    return patch.entries if isinstance(patch, LayerMap) else (patch,)
