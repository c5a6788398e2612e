"""patch / unpatch / describe / from_pretrained: the adapter says where, the scheme says what.

Every change a patch makes is recorded with its undo, on the instance only (no transformers class
or module global is touched), so a failed patch rolls back and `unpatch` is bit-exact.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from . import compat, saving, seq2seq
from .adapters.base import Adapter
from .config import PosEncConfig
from .errors import PosEncError
from .registry import adapter_for, get_scheme, supported_schemes
from .schemes.base import ModelFacts, Scheme
from .sites import (INSTALLERS, CarryKwargs, HandSlotIds, KeepPositionIds, LayerLoop, RecordPositions, RelayKwargs,
                    remove_hooks)
from .sites.qk import ROTARY_MODULE

__all__ = ["ROTARY_MODULE", "PatchState", "describe", "describe_modules", "from_pretrained", "patch", "unpatch"]

STATE_ATTR = "_posenc_state"


@dataclass
class Restore:
    """Undo record: put `obj.name` back as it was, or delete it if it did not exist."""

    obj: Any
    name: str
    old: Any
    existed: bool

    def __call__(self) -> None:
        if self.existed:
            setattr(self.obj, self.name, self.old)
        else:
            delattr(self.obj, self.name)


@dataclass
class RestoreAttention:
    """Undo record: the model's attention implementation as it was."""

    model: nn.Module
    old: str

    def __call__(self) -> None:
        compat.set_attn_implementation(self.model, self.old)


@dataclass
class RemoveHooks:
    """Undo record: every hook of the patch, wherever wrappers have moved the modules since."""

    root: nn.Module

    def __call__(self) -> None:
        remove_hooks(self.root)


@dataclass
class PatchState:
    """What is patched now and how to take it back: plain data (undo records hold references to objects of
    the model, never closures), so `deepcopy` and `torch.save` of the model copy a working patch."""

    config: PosEncConfig
    undo: list[Callable[[], None]] = field(default_factory=list)
    new_modules: list[str] = field(default_factory=list)  # paths from the base model, resolved when asked

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        self.undo.append(Restore(obj, name, getattr(obj, name, None), hasattr(obj, name)))
        setattr(obj, name, value)

    def replace(self, base: nn.Module, path: str, module: nn.Module) -> None:
        parent_path, _, name = path.rpartition(".")
        self.set_attr(base.get_submodule(parent_path) if parent_path else base, name, module)
        self.new_modules.append(path)

    def add_module(self, base: nn.Module, path: str, module: nn.Module, new: bool = False) -> None:
        """Attach a module at `path` (from the base model); `new` marks one whose weights a checkpoint must carry."""
        parent_path, _, name = path.rpartition(".")
        parent = base.get_submodule(parent_path) if parent_path else base
        parent.add_module(name, module)
        self.undo.append(Restore(parent, name, None, existed=False))
        if new:
            self.new_modules.append(path)

    def set_attn_implementation(self, model: nn.Module, name: str) -> None:
        self.undo.append(RestoreAttention(model, compat.attn_implementation(model.config)))
        compat.set_attn_implementation(model, name)

    def rollback(self) -> None:
        while self.undo:
            self.undo.pop()()


def describe(model: nn.Module) -> PosEncConfig | None:
    """The scheme patched into `model` now, with every option resolved; None if unpatched."""
    state = getattr(model, STATE_ATTR, None)
    return state.config if state is not None else None


def patch(model: nn.Module, scheme: str | PosEncConfig, **options: Any) -> nn.Module:
    """Swap the positional scheme of `model` in place and return it.

    Args:
        model: a transformers model of a supported architecture (`hf_posenc.list_architectures()`).
        scheme: a scheme name (`hf_posenc.list_schemes()`) or a `PosEncConfig`.
        **options: the scheme's options (e.g. `theta=1e4`, `factor=4.0`).
    """
    if isinstance(scheme, PosEncConfig):
        config = scheme.replace(**options) if options else scheme
    elif isinstance(scheme, str):
        config = PosEncConfig(scheme, **options)
    else:
        raise PosEncError(f"scheme must be a name or a PosEncConfig, got {type(scheme).__name__}")
    spec = get_scheme(config.scheme)
    if seq2seq.is_seq2seq(model):
        return _patch_stacks(model, config, spec)
    if config.stacks is not None:
        raise PosEncError(f"stacks={list(config.stacks)} applies to encoder-decoder models; {model.config.model_type!r} "
                          "has one attention stack")
    adapter = adapter_for(model)
    if (reason := adapter.why_not(spec)) is not None:
        raise PosEncError(
            f"{model.config.model_type!r} models ({adapter.name} adapter) cannot take scheme {spec.name!r} "
            f"({reason}); supported: {', '.join(supported_schemes(model)) or 'none'}"
        )
    previous = describe(model)
    unpatch(model)
    facts = adapter.facts(model)
    config = PosEncConfig(spec.name, **spec.resolve(config.options, facts))
    state = PatchState(config)
    try:
        _install(model, adapter, spec, facts, state)
    except BaseException:
        state.rollback()
        if previous is not None:
            patch(model, previous)
        raise
    setattr(model, STATE_ATTR, state)
    return model


def _patch_stacks(model: nn.Module, config: PosEncConfig, spec: Scheme) -> nn.Module:
    """`patch` of an encoder-decoder model: each stack as a model of its own, one state (hf_posenc.seq2seq)."""
    if (reason := seq2seq.why_not(model, spec, config.stacks)) is not None:
        raise PosEncError(f"{model.config.model_type!r} cannot take scheme {spec.name!r} ({reason})")
    previous = describe(model)
    unpatch(model)
    state = PatchState(config)
    try:
        seq2seq.install(model, config, spec, state)
    except BaseException:
        state.rollback()
        if previous is not None:
            patch(model, previous)
        raise
    setattr(model, STATE_ATTR, state)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Put back the model's own positional scheme; logits become bit-identical to before `patch`."""
    state = getattr(model, STATE_ATTR, None)
    if state is not None:
        state.rollback()
        delattr(model, STATE_ATTR)
    return model


def _install(model: nn.Module, adapter: Adapter, spec: Scheme, facts: ModelFacts, state: PatchState) -> None:
    """The parts every scheme shares; the site installer (`hf_posenc.sites`) does the rest."""
    base, config = model.base_model, model.config
    owner = base.get_submodule(adapter.loop) if adapter.loop else base
    offset = adapter.ids_offset(compat.text_config(config))
    state.undo.append(RemoveHooks(base))
    state.set_attr(config, "posenc", state.config.to_dict(original=adapter.native))
    # the folders it saves load back patched, never as the stock model (saving.py)
    model.save_pretrained = functools.partial(saving.save_pretrained, model)
    state.undo.append(functools.partial(delattr, model, "save_pretrained"))
    if (max_positions := spec.max_positions(state.config.options)) is not None:
        state.set_attr(compat.text_config(config), adapter.positions_field, max_positions + offset)
    loop = LayerLoop(spec.name, list(inspect.signature(owner.forward).parameters), offset,
                     bool(adapter.position_slot) and not adapter.slot_hooked, adapter.token_type_ids,
                     carry=adapter.from_loop(adapter.layers) if adapter.carry_kwargs else None)
    if adapter.position_slot and adapter.slot_hooked:
        loop.contributions.append(HandSlotIds(adapter.from_loop(adapter.position_slot), facts.position_offset))
    INSTALLERS[spec.site](model, adapter, spec, facts, state, loop)
    if loop.needed:
        owner.register_forward_pre_hook(loop, with_kwargs=True)
        relay = RelayKwargs if adapter.relay_kwargs else CarryKwargs if adapter.carry_kwargs else None
        for block in adapter.attention_blocks(model) if relay else ():
            block.register_forward_pre_hook(relay(adapter.attention), with_kwargs=True)
        if model is not base and _drops_position_ids(model, base):
            state.undo.append(RemoveHooks(model))
            model.register_forward_pre_hook(KeepPositionIds(adapter.loop), with_kwargs=True)
    if loop.key_positions:
        owner.register_forward_hook(RecordPositions(), with_kwargs=True)


def _drops_position_ids(model: nn.Module, base: nn.Module) -> bool:
    """The model's forward takes position_ids only into **kwargs and its base model has no such argument
    (BLOOM): explicit positions would never reach the layer-loop hook."""
    outer, inner = (inspect.signature(type(m).forward).parameters for m in (model, base))
    return "position_ids" not in outer and "position_ids" not in inner and \
        any(p.kind is p.VAR_KEYWORD for p in outer.values())


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Loading a patched checkpoint into the stock class reports the patch's keys as missing or
    unexpected; they are loaded right after, so the report would only mislead."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _checkpoint_files(path: str, **hub_kwargs: Any) -> list[str]:
    if os.path.isdir(path):
        folder = path
    else:
        from huggingface_hub import snapshot_download

        keep = {k: hub_kwargs[k] for k in ("revision", "token", "cache_dir") if k in hub_kwargs}
        folder = snapshot_download(path, allow_patterns=["*.safetensors", "*.json"], **keep)
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise PosEncError(f"no *.safetensors weights in {path!r}; save with model.save_pretrained(dir)")
    return files


def from_pretrained(path: str, model_cls: Any = None, **kwargs: Any) -> nn.Module:
    """Load a model saved after `patch`, with its positional scheme and the scheme's weights.

    Plain `from_pretrained` would silently return the unpatched architecture with the new position
    weights dropped; this re-applies `config.posenc` and then loads those weights.

    Args:
        path: a local folder or Hub repo id.
        model_cls: the transformers Auto class or model class (default `AutoModelForCausalLM`).
        **kwargs: passed to `model_cls.from_pretrained` (dtype, attn_implementation, revision, ...).
    """
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model_cls = model_cls or AutoModelForCausalLM
    with _quiet_transformers():
        model = model_cls.from_pretrained(path, **kwargs)
    posenc = getattr(model.config, "posenc", None)
    if posenc is None:
        return model
    if hasattr(model.config, "auto_map"):
        # A pushed repo's remote-code pointer; the model is patched here, and a later save_pretrained
        # would otherwise point at a file its folder does not have.
        del model.config.auto_map
    patch(model, PosEncConfig.from_dict(posenc))
    names = {id(m): n for n, m in model.named_modules()}
    wanted = {
        f"{names[id(m)]}.{key}": tensor
        for m in describe_modules(model)
        for key, tensor in m.state_dict().items()
    }
    if wanted:
        # a bare base model loaded from a checkpoint saved with a head: keys carry the base prefix
        prefixed = {f"{model.base_model_prefix}.{key}": key for key in wanted}
        found: dict[str, torch.Tensor] = {}
        for file in _checkpoint_files(path, **kwargs):
            with safe_open(file, framework="pt") as handle:
                for key in handle.keys():
                    if key in wanted or key in prefixed:
                        found[prefixed.get(key, key)] = handle.get_tensor(key)
        if missing := sorted(set(wanted) - set(found)):
            raise PosEncError(f"{path!r} lacks the weights of its {posenc['scheme']!r} patch: {', '.join(missing)}")
        with torch.no_grad():
            for key, tensor in found.items():
                wanted[key].copy_(tensor)
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
