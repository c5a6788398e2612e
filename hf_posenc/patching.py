"""patch / unpatch / describe / validate: the adapter says where, the scheme says what; validate -> install
(through `hf_posenc.sites`) -> record.

Every change a patch makes is recorded with its undo (`hf_posenc.state`), on the instance only (no
transformers class or module global is touched). Everything that can be checked against the model is
checked before the first change; if an install still fails, the previous patch's same objects go back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from typing import Any, Callable, Iterator

import torch
from torch import nn

from . import compat, self_check, seq2seq
from .adapters.base import Adapter
from .adapters.meta import meta_model
from .catalog import adapter_for, get_scheme, supported_schemes
from .config import LayerMap, PosEncConfig, layer_patch
from .domains import check_facts
from .errors import PosEncError
from .registry import ADAPTERS
from .schemes.base import ModelFacts, Scheme
from .sites import layers as layer_site
from .sites import model as model_site
from .sites import stacks
from .sites.qk import ROTARY_MODULE
from .state import STATE_ATTR, PatchState, own_config

__all__ = ["ROTARY_MODULE", "PatchState", "describe", "describe_modules", "patch", "release_check",
           "transformers_model", "unpatch", "validate"]


def describe(model: nn.Module) -> PosEncConfig | LayerMap | None:
    """The scheme patched into `model` now, with every option resolved (a LayerMap: the schemes of a
    per-layer map); None if unpatched."""
    state = getattr(model, STATE_ATTR, None)
    return state.config if state is not None else None


def patch(model: nn.Module, scheme: str | PosEncConfig | LayerMap | dict, **options: Any) -> nn.Module:
    """Swap the positional scheme of `model` in place and return it.

    A mistake raises PosEncError and leaves the model (and a previous patch, trained weights included)
    bit-identical: options are resolved against the model first, and a failed install puts the previous
    patch's own objects back.

    Args:
        model: a transformers model of a supported architecture (`hf_posenc.list_architectures()`).
        scheme: a scheme name (`hf_posenc.list_schemes()`), a `PosEncConfig`, or a per-layer map: a
            `LayerMap` or a dict `{scheme: layers}` (e.g. `{"nope": [3, 7], "rope": [0, 1, 2, 4, 5, 6]}`).
        **options: the scheme's options (e.g. `theta=1e4`, `factor=4.0`), and `layers=[...]`: the attention
            layers that take the scheme (the others keep the model's own positions).
    """
    config = _as_config(scheme, options)
    target = transformers_model(model)
    if self_check.wanted():  # past the newest transformers tested (hf_posenc.self_check)
        validate(target, config)  # a mistake is named before the check runs
        for entry in layer_site.entries_of(config):  # each scheme on every layer of a tiny model
            self_check.ensure(target, entry.replace(layers=None), _patch_now, unpatch)
    _patch_now(target, config)
    return model


def transformers_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (whose `base_model` is peft's tuner, not the model's), else
    `model`: the patch goes where the model's own modules are, and the wrapper reads it through."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def release_check(model_class: type, model_type: str, config: PosEncConfig) -> self_check.Report:
    """The release self-check of `config` on a tiny `model_class` of `model_type` (`hf-posenc doctor`)."""
    return self_check.run(model_class, model_type, config, _patch_now, unpatch)


def _patch_now(model: nn.Module, config: PosEncConfig | LayerMap) -> nn.Module:
    if seq2seq.is_seq2seq(model):
        return _patch_stacks(model, config)
    if config.layers is not None:
        config, adapter, entries, _ = _resolve_layers(model, config)
        return _replace_patch(model, config, functools.partial(layer_site.install, model, adapter, entries))
    config, adapter, spec, facts = _resolve(model, config)
    return _replace_patch(model, config, functools.partial(model_site.install, model, adapter, spec, facts))


def _replace_patch(model: nn.Module, config: PosEncConfig, install: Callable[[PatchState], None]) -> nn.Module:
    """Take the previous patch off and `install` the new one into a fresh state; if that fails, undo it
    and put the previous patch's same objects back (its trained modules, its hook objects)."""
    previous = getattr(model, STATE_ATTR, None)
    if previous is not None:
        previous.rollback()
        delattr(model, STATE_ATTR)
    shared = own_config(model)
    state = PatchState(config)
    try:
        install(state)
    except BaseException:
        state.rollback()
        for record in reversed(shared):
            record()
        if previous is not None:
            previous.reapply()
            setattr(model, STATE_ATTR, previous)
        raise
    setattr(model, STATE_ATTR, state)
    return model


def _as_config(scheme: Any, options: dict[str, Any]) -> PosEncConfig | LayerMap:
    if isinstance(scheme, PosEncConfig):
        return scheme.replace(**options) if options else scheme
    if isinstance(scheme, str):
        return PosEncConfig(scheme, **options)
    if isinstance(scheme, (LayerMap, dict, list)):
        if options:
            raise PosEncError(f"a layer map takes its options in its entries; got {sorted(options)} beside it")
        return layer_patch(scheme.entries if isinstance(scheme, LayerMap) else scheme)
    raise PosEncError(f"scheme must be a name, a PosEncConfig or a layer map, got {type(scheme).__name__}")


def validate(model_or_config: Any, scheme: str | PosEncConfig, **options: Any) -> PosEncConfig:
    """The config `patch` would install, with every option resolved against the model, or PosEncError;
    changes nothing. Takes a model or (as the CLI does before loading weights) its transformers config,
    whose model is then built on the meta device."""
    config = _as_config(scheme, options)
    if seq2seq.is_seq2seq(model_or_config):
        resolve = _resolve_layered_stacks if config.layers is not None else _resolve_stacks
        return resolve(model_or_config, config)[0]
    if config.layers is not None:
        return _resolve_layers(model_or_config, config)[0]
    return _resolve(model_or_config, config)[0]


def _resolve(model_or_config: Any, config: PosEncConfig) -> tuple[PosEncConfig, Adapter, Scheme, ModelFacts]:
    if config.stacks is not None:
        model_type = getattr(getattr(model_or_config, "config", model_or_config), "model_type", "?")
        raise PosEncError(f"stacks={list(config.stacks)} applies to encoder-decoder models; {model_type!r} "
                          "has one attention stack")
    adapter, spec = adapter_for(model_or_config), get_scheme(config.scheme)
    if (reason := adapter.why_not(spec)) is not None:
        model_type = getattr(getattr(model_or_config, "config", model_or_config), "model_type", "?")
        raise PosEncError(
            f"{model_type!r} models ({adapter.name} adapter) cannot take scheme {spec.name!r} "
            f"({reason}); supported: {', '.join(supported_schemes(model_or_config)) or 'none'}"
        )
    facts = _stock_facts(model_or_config, adapter)
    return resolve_options(spec, config, facts), adapter, spec, facts


def _resolve_layers(model_or_config: Any, patch: PosEncConfig | LayerMap
                    ) -> tuple[PosEncConfig | LayerMap, Adapter, list[layer_site.Entry], ModelFacts]:
    """Validate a per-layer patch against the stock model (every entry, the map as a whole); touches nothing."""
    model_type = getattr(getattr(model_or_config, "config", model_or_config), "model_type", "?")
    if patch.stacks is not None:
        raise PosEncError(f"stacks={list(patch.stacks)} applies to encoder-decoder models; {model_type!r} "
                          "has one attention stack")
    adapter = adapter_for(model_or_config)
    model = model_or_config if isinstance(model_or_config, nn.Module) else stock_meta(model_or_config)
    entries = _layer_entries(model, adapter, patch, repr(model_type), _stock_facts(model_or_config, adapter))
    return layer_patch([entry.config for entry in entries]), adapter, entries, entries[0].facts


def _layer_entries(model: nn.Module, adapter: Adapter, patch: PosEncConfig | LayerMap, name: str,
                   facts: ModelFacts) -> list[layer_site.Entry]:
    """The entries of a per-layer patch of one attention stack (`model`), each checked and resolved."""
    blocks = len(model.base_model.get_submodule(adapter.layers))
    attending = list(adapter.attention_layers if adapter.attention_layers is not None else range(blocks))
    covered = {i for entry in layer_site.entries_of(patch) for i in entry.layers}
    if bad := sorted(covered - set(attending)):
        raise PosEncError(f"layers {bad} are not attention layers of this {name} model: it has {blocks} "
                          f"layers, attention layers {_span(attending)}")
    covers_all = covered == set(attending)
    entries = []
    for tag, entry in enumerate(layer_site.entries_of(patch)):
        spec = get_scheme(entry.scheme)
        view = layer_site.view(adapter, entry.layers, str(tag) if tag else "", covers_all and not tag)
        if (reason := _why_not_layers(model, adapter, view, spec, covers_all)) is not None:
            raise PosEncError(f"{name} models ({adapter.name} adapter) cannot take scheme {spec.name!r} in "
                              f"layers {list(entry.layers)} ({reason})")
        entries.append(layer_site.Entry(spec, resolve_options(spec, entry, facts), view, facts))
    if len(biased := [e.spec.name for e in entries if e.spec.site in layer_site.POSENC_ATTENTION]) > 1:
        raise PosEncError(f"a layer map takes one scheme that runs in the attention function (score or attention "
                          f"site), got {biased}")
    return entries


def _why_not_layers(model: nn.Module, adapter: Adapter, view: Adapter, spec: Scheme, covers_all: bool) -> str | None:
    """Why `spec` cannot go into some layers of this model (None if it can), beyond what the view's
    mechanisms say."""
    if spec.site == "input":
        return "it adds positions to the token embeddings, before every layer; per-layer schemes act in attention"
    if not covers_all and (shared := adapter.bias_table or adapter.native_bias_switch):
        return (f"the model computes its own position bias once for every layer ({shared}): a per-layer patch "
                "must cover every layer")
    if spec.site == "none" and not covers_all and adapter.rotary is None and adapter.native_bias is None:
        return (f"nothing to remove: the model's positions ({adapter.native}) enter at the input, not in its layers; "
                "patch every layer, or give the other layers a scheme in the same map")
    attention = adapter.attention_modules(model)[0]
    if adapter.rotary and layer_site.ROTATION_KWARG not in inspect.signature(attention.forward).parameters:
        return f"its attention takes no `{layer_site.ROTATION_KWARG}` to switch its own rotation off in one layer"
    # a rotation on a rotating model goes where the whole-model patch's would (layer_site.rotation_module)
    return (adapter if adapter.rotary and spec.site == "qk" else view).why_not(spec)


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


def _stock_facts(model_or_config: Any, adapter: Adapter) -> ModelFacts:
    """The facts of the model without any patch: a patched model's patch is taken off and put back
    (the same objects, so nothing changes); a config's model is built on the meta device without weights."""
    if not isinstance(model_or_config, nn.Module):
        return dataclasses.replace(adapter.facts(stock_meta(model_or_config)), position_table=None,
                                   token_embeddings=None, device=torch.device("cpu"))
    with _unpatched(model_or_config):
        return adapter.facts(model_or_config)


def stock_meta(config: Any) -> nn.Module:
    """The model of a transformers config on the meta device, as its adapter reads it: hand-written adapters
    name paths in the base model (encoders have no causal-LM class); the generic one reads the causal LM."""
    from transformers import AutoModel

    hand_written = config.model_type in ADAPTERS and type(config) in AutoModel._model_mapping
    return meta_model(config, AutoModel._model_mapping[type(config)] if hand_written else None)


@contextlib.contextmanager
def _unpatched(model: nn.Module) -> Iterator[None]:
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


def _resolve_stacks(model: nn.Module, config: PosEncConfig) -> tuple[PosEncConfig, Scheme, dict[str, Any]]:
    """Validate an encoder-decoder patch stack by stack against the stock model; touches nothing."""
    spec = get_scheme(config.scheme)
    if (reason := seq2seq.why_not(model, spec, config.stacks)) is not None:
        raise PosEncError(f"{model.config.model_type!r} cannot take scheme {spec.name!r} ({reason})")
    with _unpatched(model):
        plan = seq2seq.plan(model, config, spec)
    return resolve_options(spec, plan.config, plan.facts[plan.first]), spec, plan


def _resolve_layered_stacks(model: nn.Module, patch: PosEncConfig | LayerMap
                            ) -> tuple[PosEncConfig | LayerMap, seq2seq.StackPlan, dict[str, list[layer_site.Entry]]]:
    """A per-layer patch of an encoder-decoder model: the same layers in each stack it names (default: the text
    stacks), validated stack by stack against the stock model; options resolved against the first."""
    names = patch.stacks or seq2seq.text_stacks(model)
    if not names:
        raise PosEncError(f"{model.config.model_type!r}: no stack reads text")
    with _unpatched(model):
        adapters = {stack: seq2seq.stack_adapter(model, stack) for stack in names}
        modules = {stack: seq2seq.stack_module(model, stack) for stack in names}
        facts = {stack: adapters[stack].facts(modules[stack]) for stack in names}
        bare = patch.replace(stacks=None)
        entries = {stack: _layer_entries(modules[stack], adapters[stack], bare,
                                         f"{model.config.model_type!r} {stack}", facts[stack]) for stack in names}
    resolved = layer_patch([entry.config for entry in entries[names[0]]]).replace(stacks=tuple(names))
    return resolved, seq2seq.StackPlan(resolved, adapters, facts), entries


def _patch_stacks(model: nn.Module, config: PosEncConfig | LayerMap) -> nn.Module:
    """`patch` of an encoder-decoder model: each stack as a model of its own, one state (hf_posenc.seq2seq);
    validated first, and a failed install puts the previous patch's same objects back."""
    if config.layers is not None:
        resolved, plan, entries = _resolve_layered_stacks(model, config)
        return _replace_patch(model, resolved, functools.partial(stacks.install, model, plan, None, entries=entries))
    resolved, spec, plan = _resolve_stacks(model, config)
    return _replace_patch(model, resolved, functools.partial(stacks.install, model, plan, spec))


def unpatch(model: nn.Module) -> nn.Module:
    """Put back the model's own positional scheme; logits become bit-identical to before `patch`."""
    target = transformers_model(model)
    state = getattr(target, STATE_ATTR, None)
    if state is not None:
        state.rollback()
        delattr(target, STATE_ATTR)
    return model


def describe_modules(model: nn.Module) -> list[nn.Module]:
    """The modules the current patch installed that carry weights or saved buffers (what a recipe should
    train and a checkpoint must hold): the ones that run now, looked up by path, so a peft wrapper's active
    copy and a merged model's module are what is named."""
    model = transformers_model(model)
    state = getattr(model, STATE_ATTR, None)
    if state is None:
        return []
    found = (compat.running_module(model.base_model.get_submodule(path)) for path in state.new_modules)
    return [module for module in found if module.state_dict()]
