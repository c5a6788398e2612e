"""patch / unpatch / describe / validate: the adapter says where, the scheme says what; plan (`hf_posenc.plan`)
-> install (`hf_posenc.sites`) -> record (`hf_posenc.recording`), one pass down.

Every change a patch makes is recorded with its undo (`hf_posenc.state`), on the instance only (no
transformers class or module global is touched; torch.compile is made to guard on module hooks, `compat.guard_hooks`). Everything that can be checked against the model is
checked before the first change; if an install still fails, the previous patch's same objects go back.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from . import compat, self_check, sites
from .config import LayerMap, PosEncConfig, as_patch
from .plan import plan
from .recording import record
from .sites.qk import ROTARY_MODULE
from .state import STATE_ATTR, PatchState, convert_held, own_config

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
    _apply(transformers_model(model), scheme, options, check=True)
    return model


def transformers_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (whose `base_model` is peft's tuner, not the model's), else
    `model`: the patch goes where the model's own modules are, and the wrapper reads it through."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def release_check(model_class: type, model_type: str, config: PosEncConfig) -> self_check.Report:
    """The release self-check of `config` on a tiny `model_class` of `model_type` (`hf-posenc doctor`)."""
    return self_check.run(model_class, model_type, config, _patch_now, unpatch)


def _patch_now(model: nn.Module, config: PosEncConfig | LayerMap) -> nn.Module:
    """Plan and install `config` (what the self-check patches its tiny models with)."""
    return _apply(model, config, {}, check=False)


def _apply(model: nn.Module, scheme: str | PosEncConfig | LayerMap | dict, options: dict[str, Any],
           check: bool) -> nn.Module:
    """Normalise, plan, install, record: one pass down. `check`: run the self-check first where it is wanted (past
    the newest transformers tested, `hf_posenc.self_check`). The install takes the previous patch off and installs
    the new one into a fresh state; if that fails, it undoes it and puts the previous patch's same objects back (its
    trained modules, its hooks)."""
    check = check and self_check.wanted()
    config = as_patch(scheme, options)
    planned = plan(model, config)  # a mistake is named before the self-check runs
    if check:
        for entry in config.entries:  # each scheme on every layer of a tiny model
            self_check.ensure(model, entry.replace(layers=None), _patch_now, unpatch)
    previous = getattr(model, STATE_ATTR, None)
    if previous is not None:
        previous.rollback()
        delattr(model, STATE_ATTR)
    shared = own_config(model)
    state = PatchState(planned.config, stock=planned.stock)
    compat.guard_hooks()
    try:
        sites.install(model, planned.stacks, state)
        record(model, planned, state)
        state.set_attr(model, "_apply", functools.partial(convert_held, model, state), instance=True)
    except BaseException:
        state.rollback()
        for restore in reversed(shared):
            restore()
        if previous is not None:
            previous.reapply()
            setattr(model, STATE_ATTR, previous)
        raise
    setattr(model, STATE_ATTR, state)
    return model


def validate(model_or_config: Any, scheme: str | PosEncConfig | LayerMap | dict, **options: Any
             ) -> PosEncConfig | LayerMap:
    """The config `patch` would install, with every option resolved against the model, or PosEncError;
    changes nothing. Takes a model or (as the CLI does before loading weights) its transformers config,
    whose model is then built on the meta device."""
    return plan(model_or_config, as_patch(scheme, options)).config


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
