"""Query/key site (rope and its scalings): rotate q and k before the KV cache stores k.

A model that rotates natively takes the scheme as config (`rope_parameters` and a rebuilt rotary module,
which plain transformers reloads) or, for a different rotating fraction, the scheme's rotary module in
its slot. Other models get the rotary module as `posenc_rotary` on the loop owner: the layer-loop hook
computes (cos, sin) once per forward and passes them down; a pre-hook on each attention module hands them
to forward hooks on the q/k projections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from .. import compat
from ..adapters.base import QKTap
from ..attention import Positions
from ..errors import PosEncError
from ..schemes.base import ModelFacts, Scheme
from ..schemes.building import place
from ..schemes.rope import native_partial, native_theta
from ..schemes.rotary import carry_attributes, rotate
from .base import LayerLoop, PatchHook, remove_hooks, remove_native_positions
from .entry import Entry, slot_needs

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..state import PatchState

ROTARY_KWARG = "posenc_rotary"  # private kwarg carrying (cos, sin) from the layer loop to the attention modules
ROTARY_MODULE = "posenc_rotary"  # where the rotary module lives on a model that had none
KIND = "rotary"  # what analysis calls the positions of this site
TITLE = "queries and keys (rotation)"  # what a model card calls it
PROBE = ("rope", {"theta": 100.0})  # the self-check's "takes effect" scheme: a theta of its own moves a rotating model


def needs(adapter: Adapter, spec: Scheme) -> list[str]:
    """The mechanisms (adapters.base.MECHANISMS) a rotation needs: config on a natively rotating model (one
    rebuild per RoPE type, probed each on its own), else hooks on the q/k taps."""
    rope_type = getattr(spec, "rope_type", "default")
    return slot_needs(adapter) + (["rope_config", f"rope_config:{rope_type}"] if adapter.rotation else ["qk_tap", "kwargs"])


class RotaryKwarg:
    """Contribution: (cos, sin) of the query positions from the rotary module at `path`, as `kwarg`."""

    def __init__(self, path: str, kwarg: str = ROTARY_KWARG) -> None:
        self.path, self.kwarg = path, kwarg

    def __call__(self, owner: nn.Module, kwargs: dict[str, Any], positions: Positions) -> None:
        ref = torch.empty(0, device=positions.queries.device)
        kwargs[self.kwarg] = owner.get_submodule(self.path)(ref, positions.queries)


class RotateOutput(PatchHook):
    """Forward hook on a q/k projection (or the packed [q | k | v] one): rotates what it emits by the
    rotation its attention module's pre-hook left here for this call."""

    def __init__(self, tap: QKTap, head_dim: int) -> None:
        self.tap, self.head_dim = tap, head_dim
        self.rotation: tuple[torch.Tensor, torch.Tensor] | None = None  # set per call, consumed at once

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        heads = x if self.tap.per_head else x.unflatten(-1, (-1, self.head_dim))
        out = rotate(heads, cos, sin)
        return out if self.tap.per_head else out.flatten(-2)

    def __call__(self, projection: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        (cos, sin), self.rotation = self.rotation, None
        if not self.tap.packed:
            return self.rotate(output, cos, sin)
        return rotate_packed(output, self.tap.layout or "grouped", self.head_dim, self.tap.groups,
                             lambda heads: rotate(heads, cos, sin))


def rotate_packed(x: torch.Tensor, layout: str, head_dim: int, groups: int,
                  turn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """A packed projection's output (adapters.base.PACKED_LAYOUTS) with q and k, each unfolded to (..., heads,
    head_dim), put through `turn`, and v as it was; `groups` query heads per key-value head."""
    if layout == "per_head":  # [q_h k_h v_h] per head
        q, k, v = x.unflatten(-1, (-1, 3, head_dim)).unbind(-2)
        return torch.stack((turn(q), turn(k), v), -2).flatten(-3)
    if layout == "kv_groups":  # [q_1..q_g | k | v] per key-value group
        grouped = x.unflatten(-1, (-1, groups + 2, head_dim))
        q = turn(grouped[..., :groups, :].flatten(-3, -2)).unflatten(-2, (-1, groups))
        k = turn(grouped[..., groups, :]).unsqueeze(-2)
        return torch.cat((q, k, grouped[..., groups + 1:, :]), -2).flatten(-3)
    kv_width = x.shape[-1] // (groups + 2)  # [q | k | v]
    q, k, v = x.split((groups * kv_width, kv_width, kv_width), -1)
    return torch.cat((turn(q.unflatten(-1, (-1, head_dim))).flatten(-2),
                      turn(k.unflatten(-1, (-1, head_dim))).flatten(-2), v), -1)


class QKRotation(PatchHook):
    """Forward pre-hook on an attention module: takes the rotation the layer loop passed down and leaves it
    on the hooks of the q/k projections. The hooks sit on whatever module is at the projection path now:
    peft's LoRA wraps `q_proj` and adds its update after the original, so the rotation must act on the
    wrapper's output (and a merge puts the original back)."""

    def __init__(self, tap: QKTap, head_dim: int, kwarg: str = ROTARY_KWARG) -> None:
        self.tap, self.head_dim, self.kwarg = tap, head_dim, kwarg

    def hook_at(self, attention: nn.Module, path: str) -> RotateOutput:
        target = attention.get_submodule(path)
        hook = next((h for h in target._forward_hooks.values() if isinstance(h, RotateOutput)), None)
        if hook is None:
            remove_hooks(target, RotateOutput)  # on the module a wrapper now holds inside
            hook = RotateOutput(self.tap, self.head_dim)
            target.register_forward_hook(hook)
        return hook

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if self.kwarg not in kwargs:
            raise PosEncError("rotary positions missing: a patched attention module was called outside its model")
        kwargs = dict(kwargs)
        rotation = kwargs.pop(self.kwarg)
        for path in self.tap.projections:
            self.hook_at(attention, path).rotation = rotation
        return args, kwargs


def layer_parameters(spec: Scheme, options: dict[str, Any], facts: ModelFacts, own: dict[str, Any]) -> dict[str, Any]:
    """The scheme's rope_parameters for layers whose own are `own`, keeping the rotating fraction and the
    model's own keys. Models with a rotation per layer type (Gemma 3: theta 10k on sliding, 1M on full
    layers) keep each type's theta unless `theta` was set."""
    if "rope_theta" in own and options["theta"] == native_theta(facts):
        options = {**options, "theta": own["rope_theta"]}
    params = spec.rope_parameters(options, facts)
    params.update({k: v for k, v in own.items() if k == "partial_rotary_factor" or k not in compat.ROPE_KEYS})
    return params


def install(model: nn.Module, entry: Entry, state: PatchState, loop: LayerLoop) -> None:
    base, config, options = model.base_model, compat.text_config(model.config), entry.config.options
    adapter, spec, facts = entry.adapter, entry.spec, entry.facts
    if adapter.rotation and spec.config_only and options["partial"] == native_partial(facts):
        # Natively rotating model: scaling is config; plain transformers reloads it.
        own = compat.rope_parameters(config) or {}
        if adapter.rotation.layer_types:
            # layer types without a rotation (NoPE layers: None) stay without one
            params = {kind: layer_parameters(spec, options, facts, own[kind]) if own[kind] else None for kind in own}
        else:
            params = layer_parameters(spec, options, facts, own)
        state.set_attr(config, "rope_parameters", params)
        old = base.get_submodule(adapter.rotation.module)
        state.replace(base, adapter.rotation.module, place(type(old)(config=compat.with_head_dim(config)), facts))
        state.rebuilt_rotary = type(old).__module__.startswith("transformers.")
    else:
        # as long as the model (rows before position 0 included; BLOOM's config names none: its trained length)
        rotary = place(spec.rotary(options, facts, facts.max_positions + facts.ids_offset), facts)
        if adapter.rotation:
            carry_attributes(rotary, base.get_submodule(adapter.rotation.module))
            state.replace(base, adapter.rotation.module, rotary)
            loop.slot = loop.slot or not spec.shift_invariant
        else:
            name, kwarg = ROTARY_MODULE + entry.tag, ROTARY_KWARG + entry.tag
            state.add_module(base, adapter.at_loop(name), rotary, new=True)  # FoPE's weights
            loop.contributions.append(RotaryKwarg(name, kwarg))
            for attention in adapter.attention_modules(model):
                rotation = QKRotation(adapter.qk, facts.head_dim, kwarg)
                attention.register_forward_pre_hook(rotation, with_kwargs=True)
                for path in adapter.qk.projections:
                    rotation.hook_at(attention, path)
    remove_native_positions(model, entry, state, keep_rotary=True)
