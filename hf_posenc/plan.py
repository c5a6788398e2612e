"""The plan of a patch: what `patch` will install where, found and checked before the first change.

The model is read once (`hf_posenc.view`: its stacks, their adapters, their stock modules and facts); a plan is the
stacks the patch goes into (an encoder-decoder has two, any other model one: itself), each an adapter with its
entries (`sites.Entry`): a whole-model patch is one entry covering every layer, a per-layer map one entry per
scheme. An entry carries its scheme, its options resolved against the stock model's facts (once), the view of the
adapter it installs through, and those facts. `validate` is a plan and nothing more; `patch` installs one. A model
or a transformers config is planned alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from .adapters.base import Adapter
from .catalog import supported_schemes
from .config import LayerMap, PosEncConfig, layer_patch
from .errors import PosEncError, Unsupported
from .schemes.base import SCHEMES, ModelFacts, Scheme
from .sites import Entry, StackPlan, stacks_refusal
from .sites import layers as layer_site
from .view import ModelView, StockRead, StockStack, keep, planned, read, stock


@dataclasses.dataclass(frozen=True)
class Plan:
    """The whole patch with its options resolved (what `describe` gives back), and its stacks."""

    config: PosEncConfig | LayerMap
    stacks: tuple[StackPlan, ...]
    native: str  # the scheme the model was pretrained with (its first stack's), which `config.posenc` records
    stock: StockRead | None = None  # a model's stock read, which its patch keeps (None: a config was planned)


def plan(subject: Any, patch: PosEncConfig | LayerMap) -> Plan:
    """The plan of `patch` on `subject` (a model, or its transformers config), or PosEncError naming what is wrong;
    changes nothing (a patched model is read as it was before its patch)."""
    subject = planned(subject)
    kept = keep(subject) if isinstance(subject, nn.Module) else None
    view = kept.view if kept is not None else read(subject)
    names = view.names(patch.stacks)
    if patch.layers is not None:
        return _per_layer(_stacks(subject, kept, view, names), patch, repr(view.model_type), kept)
    spec = SCHEMES[patch.scheme]  # the config named a known scheme; every built-in is registered by now
    if (reason := stacks_refusal(view, spec, names)) is not None:
        supported = supported_schemes(subject)
        what = f"{view.model_type!r}" if view.two_stacks else f"{view.model_type!r} models ({view.only().name} adapter)"
        raise Unsupported(f"{what} cannot take scheme {spec.name!r} ({reason})"
                          f"{'' if view.two_stacks else '; supported: ' + (', '.join(supported) or 'none')}",
                          spec.name, reason, supported)
    return _whole(spec, _stacks(subject, kept, view, names), patch, kept)


def _stacks(subject: Any, kept: StockRead | None, view: ModelView, names: tuple[str | None, ...]
            ) -> tuple[StockStack, ...]:
    """The stacks `names` as the stock model has them: from a model's stock read, else off a config's model."""
    return kept.named(names) if kept is not None and names else stock(subject, view, names)


def _whole(spec: Scheme, stacks: tuple[StockStack, ...], patch: PosEncConfig, kept: StockRead | None) -> Plan:
    """One entry per stack, over every layer: an encoder-decoder's stacks take the same options, resolved against
    the first."""
    names = tuple(stack.name for stack in stacks) if stacks[0].name is not None else None
    resolved, length = _resolve(spec, patch.replace(stacks=names) if names else patch, stacks[0].facts)
    found = tuple(StackPlan(stack.name, stack.adapter, (Entry(spec, resolved, stack.adapter, stack.facts, length),))
                  for stack in stacks)
    return Plan(resolved, found, stacks[0].adapter.native, kept)


def _per_layer(stacks: tuple[StockStack, ...], patch: PosEncConfig | LayerMap, name: str, kept: StockRead | None
               ) -> Plan:
    """The entries of a per-layer patch in each stack: an encoder-decoder's stacks take the same."""
    planned = []
    for stack in stacks:
        where = f"{name} {stack.name}" if stack.name else name
        entries = _layer_entries(stack.module, stack.adapter, patch, where, stack.facts)
        planned.append(StackPlan(stack.name, stack.adapter, entries, per_layer=True))
    resolved = layer_patch([entry.config for entry in planned[0].entries])
    names = tuple(stack.name for stack in stacks) if stacks[0].name is not None else None
    return Plan(resolved.replace(stacks=names) if names else resolved, tuple(planned), stacks[0].adapter.native,
                kept)


def _layer_entries(model: nn.Module, adapter: Adapter, patch: PosEncConfig | LayerMap, name: str,
                   facts: ModelFacts) -> tuple[Entry, ...]:
    """The entries of a per-layer patch of one attention stack (`model`), each checked and resolved."""
    blocks, attention_layers = len(model.base_model.get_submodule(adapter.blocks.layers)), adapter.blocks.attention_layers
    attending = list(attention_layers if attention_layers is not None else range(blocks))
    covered, configs = set(patch.layers), patch.entries
    if bad := sorted(covered - set(attending)):
        raise PosEncError(f"layers {bad} are not attention layers of this {name} model: it has {blocks} "
                          f"layers, attention layers {_span(attending)}")
    covers_all = covered == set(attending)
    specs = [SCHEMES[entry.scheme] for entry in configs]
    views = []  # each entry's view of the adapter, checked: first the entries, then the map, then their options
    for tag, (entry, spec) in enumerate(zip(configs, specs)):
        views.append(layer_site.view(adapter, entry.layers, owns=covers_all and not tag))
        if (reason := layer_site.layer_refusal(model, adapter, views[-1], spec, covers_all,
                                               keeps_slot=not (covers_all and not tag))) is not None:
            raise PosEncError(f"{name} models ({adapter.name} adapter) cannot take scheme {spec.name!r} in "
                              f"layers {list(entry.layers)} ({reason})")
    if (reason := layer_site.map_refusal(specs)) is not None:
        raise PosEncError(reason)
    entries = []
    for tag, (entry, spec, view) in enumerate(zip(configs, specs, views)):
        resolved, length = _resolve(spec, entry, facts)
        entries.append(Entry(spec, resolved, view, facts, length, tag=str(tag) if tag else "",
                             keeps_slot=not (covers_all and not tag)))
    return tuple(entries)


def _span(indices: list[int]) -> str:
    return f"{indices[0]}-{indices[-1]}" if indices == list(range(indices[0], indices[-1] + 1)) else str(indices)


def resolve_options(spec: Scheme, config: PosEncConfig, facts: ModelFacts) -> PosEncConfig:
    """`config` with its defaults resolved against a model's facts: what the resolution changed is checked against
    the options' domains, every option against the model's facts (PosEncError if not valid)."""
    return _resolve(spec, config, facts)[0]


def _resolve(spec: Scheme, config: PosEncConfig, facts: ModelFacts) -> tuple[PosEncConfig, int | None]:
    """`resolve_options`, and the `max_position_embeddings` the scheme sets (None: it sets none)."""
    try:
        with torch.device("cpu"):  # what a scheme reads off a model made on the meta device: stand-ins on the CPU
            options = spec.resolve(config.options, facts)
        if (length := spec.max_positions(options)) is not None and length < 1:
            raise PosEncError(f"scheme {spec.name!r} would leave the model {length} positions; options: {options}")
        return config.resolved(options, facts.named()), length
    except PosEncError as err:
        raise PosEncError(str(err) if str(err).startswith("scheme ") else f"scheme {spec.name!r}: {err}") from err


__all__ = ["Plan", "plan", "resolve_options"]
