"""The plan of a patch: what `patch` will install where, found and checked before the first change.

A plan is the model's attention stacks (an encoder-decoder has two, any other model one: itself), each an adapter
with its entries (`sites.Entry`): a whole-model patch is one entry covering every layer, a per-layer map one entry
per scheme. An entry carries its scheme, its options resolved against the stock model's facts (once), the view of
the adapter it installs through, and those facts. `validate` is a plan and nothing more; `patch` installs one.
A model or a transformers config is planned alike: a config's model is built on the meta device (an
encoder-decoder config's with its two stacks).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import torch
from torch import nn

from . import seq2seq, sites
from .adapters.base import Adapter
from .adapters.meta import meta_model
from .catalog import adapter_for, get_scheme, stacks_why_not, supported_schemes
from .config import LayerMap, PosEncConfig, layer_patch
from .domains import check_facts
from .errors import PosEncError
from .registry import ADAPTERS
from .schemes.base import ModelFacts, Scheme
from .sites import Entry, Stack
from .sites import layers as layer_site
from .state import STATE_ATTR


@dataclasses.dataclass(frozen=True)
class Plan:
    """The whole patch with its options resolved (what `describe` gives back), and its stacks."""

    config: PosEncConfig | LayerMap
    stacks: tuple[Stack, ...]

    @property
    def native(self) -> str:
        """The scheme the model was pretrained with (its first stack's), which `config.posenc` records."""
        return self.stacks[0].adapter.native


def plan(subject: Any, patch: PosEncConfig | LayerMap) -> Plan:
    """The plan of `patch` on `subject` (a model, or its transformers config), or PosEncError naming what is wrong;
    changes nothing (a patched model is read as it was before its patch)."""
    if not isinstance(subject, nn.Module) and getattr(subject, "is_encoder_decoder", False):
        subject = meta_model(subject, encoder_decoder=True)
    if seq2seq.is_seq2seq(subject):
        with unpatched(subject):
            return _two_stacks(subject, patch)
    name = repr(getattr(getattr(subject, "config", subject), "model_type", "?"))
    if patch.stacks is not None:
        raise PosEncError(f"stacks={list(patch.stacks)} applies to encoder-decoder models; {name} has one attention "
                          "stack")
    adapter = adapter_for(subject)
    if patch.layers is not None:
        model = subject if isinstance(subject, nn.Module) else stock_meta(subject)
        entries = _layer_entries(model, adapter, patch, name, _stock_facts(subject, adapter))
        return Plan(layer_patch([e.config for e in entries]), (Stack(None, adapter, entries, per_layer=True),))
    spec = get_scheme(patch.scheme)
    if (reason := sites.why_not(adapter, spec)) is not None:
        raise PosEncError(f"{name} models ({adapter.name} adapter) cannot take scheme {spec.name!r} ({reason}); "
                          f"supported: {', '.join(supported_schemes(subject)) or 'none'}")
    facts = _stock_facts(subject, adapter)
    entry = Entry(spec, resolve_options(spec, patch, facts), adapter, facts)
    return Plan(entry.config, (Stack(None, adapter, (entry,)),))


def _two_stacks(model: nn.Module, patch: PosEncConfig | LayerMap) -> Plan:
    """An encoder-decoder model: each stack (`patch.stacks`, default the stacks that read text) planned as a model
    of its own; the options are resolved against the first, so both stacks take the same."""
    name = repr(model.config.model_type)
    if patch.layers is None and (reason := stacks_why_not(model, get_scheme(patch.scheme), patch.stacks)):
        raise PosEncError(f"{name} cannot take scheme {patch.scheme!r} ({reason})")
    names = patch.stacks or seq2seq.text_stacks(model)
    if not names:
        raise PosEncError(f"{name}: no stack reads text")
    adapters = {stack: seq2seq.stack_adapter(model, stack) for stack in names}
    facts = {stack: adapters[stack].facts(seq2seq.stack_module(model, stack)) for stack in names}
    if patch.layers is not None:
        bare = patch.replace(stacks=None)
        entries = {stack: _layer_entries(seq2seq.stack_module(model, stack), adapters[stack], bare,
                                         f"{name} {stack}", facts[stack]) for stack in names}
        resolved = layer_patch([entry.config for entry in entries[names[0]]]).replace(stacks=tuple(names))
        return Plan(resolved, tuple(Stack(s, adapters[s], entries[s], per_layer=True) for s in names))
    spec = get_scheme(patch.scheme)
    resolved = resolve_options(spec, patch.replace(stacks=tuple(names)), facts[names[0]])
    return Plan(resolved, tuple(Stack(s, adapters[s], (Entry(spec, resolved, adapters[s], facts[s]),)) for s in names))


def _layer_entries(model: nn.Module, adapter: Adapter, patch: PosEncConfig | LayerMap, name: str,
                   facts: ModelFacts) -> tuple[Entry, ...]:
    """The entries of a per-layer patch of one attention stack (`model`), each checked and resolved."""
    blocks = len(model.base_model.get_submodule(adapter.layers))
    attending = list(adapter.attention_layers if adapter.attention_layers is not None else range(blocks))
    covered = {i for entry in patch.entries for i in entry.layers}
    if bad := sorted(covered - set(attending)):
        raise PosEncError(f"layers {bad} are not attention layers of this {name} model: it has {blocks} "
                          f"layers, attention layers {_span(attending)}")
    covers_all = covered == set(attending)
    entries = []
    for tag, entry in enumerate(patch.entries):
        spec = get_scheme(entry.scheme)
        view = layer_site.view(adapter, entry.layers, str(tag) if tag else "", covers_all and not tag)
        if (reason := layer_site.why_not(model, adapter, view, spec, covers_all)) is not None:
            raise PosEncError(f"{name} models ({adapter.name} adapter) cannot take scheme {spec.name!r} in "
                              f"layers {list(entry.layers)} ({reason})")
        entries.append(Entry(spec, resolve_options(spec, entry, facts), view, facts))
    if (reason := layer_site.why_not_map([e.spec for e in entries])) is not None:
        raise PosEncError(reason)
    return tuple(entries)


def _span(indices: list[int]) -> str:
    return f"{indices[0]}-{indices[-1]}" if indices == list(range(indices[0], indices[-1] + 1)) else str(indices)


def resolve_options(spec: Scheme, config: PosEncConfig, facts: ModelFacts) -> PosEncConfig:
    """`config` with its defaults resolved against a model's facts, checked again (PosEncError if not valid)."""
    try:
        # the bounds that name a model fact (d_pos, LongRoPE list lengths): the CLI checks the same from config.json
        check_facts(getattr(spec, "Options", None), config.options, facts.named())
        with torch.device("cpu"):  # what a scheme reads off a model made on the meta device: stand-ins on the CPU
            options = spec.resolve(config.options, facts)
        resolved = PosEncConfig(spec.name, stacks=config.stacks, layers=config.layers, **options)
    except PosEncError as err:  # an option against the model's facts (d_pos, LongRoPE list lengths, ...)
        raise PosEncError(str(err) if str(err).startswith("scheme ") else f"scheme {spec.name!r}: {err}") from err
    if (length := spec.max_positions(resolved.options)) is not None and length < 1:
        raise PosEncError(f"scheme {spec.name!r} would leave the model {length} positions; options: {resolved.options}")
    return resolved


def _stock_facts(subject: Any, adapter: Adapter) -> ModelFacts:
    """The facts of the model without any patch: a patched model's patch is taken off and put back (the same
    objects, so nothing changes); a config's model is built on the meta device without weights."""
    if not isinstance(subject, nn.Module):
        return dataclasses.replace(adapter.facts(stock_meta(subject)), position_table=None,
                                   token_embeddings=None, device=torch.device("cpu"))
    with unpatched(subject):
        return adapter.facts(subject)


def stock_meta(config: Any) -> nn.Module:
    """The model of a transformers config on the meta device, as its adapter reads it: hand-written adapters
    name paths in the base model (encoders have no causal-LM class); the generic one reads the causal LM."""
    from transformers import AutoModel

    hand_written = config.model_type in ADAPTERS and type(config) in AutoModel._model_mapping
    return meta_model(config, AutoModel._model_mapping[type(config)] if hand_written else None)


@contextlib.contextmanager
def unpatched(model: nn.Module) -> Iterator[None]:
    """The model as it was before its patch, for reading: the same objects are taken off and put back."""
    state = getattr(model, STATE_ATTR, None)
    if state is None:
        yield
        return
    state.rollback()
    try:
        yield
    finally:
        state.reapply()


__all__ = ["Plan", "plan", "resolve_options", "stock_meta", "unpatched"]
