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
from typing import Any, Callable, Iterator

import torch
from torch import nn

from . import compat, self_check, seq2seq
from .adapters.base import Adapter
from .adapters.meta import meta_model
from .catalog import adapter_for, get_scheme, supported_schemes
from .config import PosEncConfig
from .errors import PosEncError
from .registry import ADAPTERS
from .schemes.base import ModelFacts, Scheme
from .sites import model as model_site
from .sites import stacks
from .sites.qk import ROTARY_MODULE
from .state import STATE_ATTR, PatchState

__all__ = ["ROTARY_MODULE", "PatchState", "describe", "describe_modules", "patch", "release_check",
           "unpatch", "validate"]


def describe(model: nn.Module) -> PosEncConfig | None:
    """The scheme patched into `model` now, with every option resolved; None if unpatched."""
    state = getattr(model, STATE_ATTR, None)
    return state.config if state is not None else None


def patch(model: nn.Module, scheme: str | PosEncConfig, **options: Any) -> nn.Module:
    """Swap the positional scheme of `model` in place and return it.

    A mistake raises PosEncError and leaves the model (and a previous patch, trained weights included)
    bit-identical: options are resolved against the model first, and a failed install puts the previous
    patch's own objects back.

    Args:
        model: a transformers model of a supported architecture (`hf_posenc.list_architectures()`).
        scheme: a scheme name (`hf_posenc.list_schemes()`) or a `PosEncConfig`.
        **options: the scheme's options (e.g. `theta=1e4`, `factor=4.0`).
    """
    config = _as_config(scheme, options)
    if self_check.wanted():  # past the newest transformers tested (hf_posenc.self_check)
        validate(model, config)  # a mistake is named before the check runs
        self_check.ensure(model, config, _patch_now, unpatch)
    return _patch_now(model, config)


def release_check(model_class: type, model_type: str, config: PosEncConfig) -> self_check.Report:
    """The release self-check of `config` on a tiny `model_class` of `model_type` (`hf-posenc doctor`)."""
    return self_check.run(model_class, model_type, config, _patch_now, unpatch)


def _patch_now(model: nn.Module, config: PosEncConfig) -> nn.Module:
    if seq2seq.is_seq2seq(model):
        return _patch_stacks(model, config)
    config, adapter, spec, facts = _resolve(model, config)
    return _replace_patch(model, config, functools.partial(model_site.install, model, adapter, spec, facts))


def _replace_patch(model: nn.Module, config: PosEncConfig, install: Callable[[PatchState], None]) -> nn.Module:
    """Take the previous patch off and `install` the new one into a fresh state; if that fails, undo it
    and put the previous patch's same objects back (its trained modules, its hook objects)."""
    previous = getattr(model, STATE_ATTR, None)
    if previous is not None:
        previous.rollback()
        delattr(model, STATE_ATTR)
    state = PatchState(config)
    try:
        install(state)
    except BaseException:
        state.rollback()
        if previous is not None:
            previous.reapply()
            setattr(model, STATE_ATTR, previous)
        raise
    setattr(model, STATE_ATTR, state)
    return model


def _as_config(scheme: Any, options: dict[str, Any]) -> PosEncConfig:
    if isinstance(scheme, PosEncConfig):
        return scheme.replace(**options) if options else scheme
    if isinstance(scheme, str):
        return PosEncConfig(scheme, **options)
    raise PosEncError(f"scheme must be a name or a PosEncConfig, got {type(scheme).__name__}")


def validate(model_or_config: Any, scheme: str | PosEncConfig, **options: Any) -> PosEncConfig:
    """The config `patch` would install, with every option resolved against the model, or PosEncError;
    changes nothing. Takes a model or (as the CLI does before loading weights) its transformers config,
    whose model is then built on the meta device."""
    config = _as_config(scheme, options)
    if seq2seq.is_seq2seq(model_or_config):
        return _resolve_stacks(model_or_config, config)[0]
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


def resolve_options(spec: Scheme, config: PosEncConfig, facts: ModelFacts) -> PosEncConfig:
    """`config` with its defaults resolved against a model's facts, checked again (PosEncError if not valid)."""
    try:
        resolved = PosEncConfig(spec.name, stacks=config.stacks, **spec.resolve(config.options, facts))
    except PosEncError as err:  # an option against the model's facts (d_pos, LongRoPE list lengths, ...)
        raise PosEncError(str(err) if str(err).startswith("scheme ") else f"scheme {spec.name!r}: {err}") from err
    if (length := spec.max_positions(resolved.options)) is not None and length < 1:
        raise PosEncError(f"scheme {spec.name!r} would leave the model {length} positions; options: {resolved.options}")
    return resolved


def _stock_facts(model_or_config: Any, adapter: Adapter) -> ModelFacts:
    """The facts of the model without any patch: a patched model's patch is taken off and put back
    (the same objects, so nothing changes); a config's model is built on the meta device without weights."""
    if not isinstance(model_or_config, nn.Module):
        from transformers import AutoModel

        # hand-written adapters name paths in the base model (encoders have no causal-LM class); the
        # generic one reads the causal LM, as it did to find them
        hand_written = model_or_config.model_type in ADAPTERS and type(model_or_config) in AutoModel._model_mapping
        meta = meta_model(model_or_config, AutoModel._model_mapping[type(model_or_config)] if hand_written else None)
        return dataclasses.replace(adapter.facts(meta), position_table=None, token_embeddings=None,
                                   device=torch.device("cpu"))
    with _unpatched(model_or_config):
        return adapter.facts(model_or_config)


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


def _patch_stacks(model: nn.Module, config: PosEncConfig) -> nn.Module:
    """`patch` of an encoder-decoder model: each stack as a model of its own, one state (hf_posenc.seq2seq);
    validated first, and a failed install puts the previous patch's same objects back."""
    resolved, spec, plan = _resolve_stacks(model, config)
    return _replace_patch(model, resolved, functools.partial(stacks.install, model, plan, spec))


def unpatch(model: nn.Module) -> nn.Module:
    """Put back the model's own positional scheme; logits become bit-identical to before `patch`."""
    state = getattr(model, STATE_ATTR, None)
    if state is not None:
        state.rollback()
        delattr(model, STATE_ATTR)
    return model


def describe_modules(model: nn.Module) -> list[nn.Module]:
    """The modules the current patch installed that carry weights or saved buffers (what a recipe should
    train and a checkpoint must hold): the ones that run now, looked up by path, so a peft wrapper's active
    copy and a merged model's module are what is named."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model
    state = getattr(model, STATE_ATTR, None)
    if state is None:
        return []
    found = (compat.running_module(model.base_model.get_submodule(path)) for path in state.new_modules)
    return [module for module in found if module.state_dict()]
