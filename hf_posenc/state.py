"""PatchState and its undo records: what a patch changed, kept as plain data, undone and redone exactly.

Every record has swap semantics: calling it exchanges what the model holds now with what the record
holds, so the same call undoes a change and, called again, puts the *same objects* back (a previous
patch's trained modules, its hook objects). A failed re-patch therefore restores the previous patch
bit for bit instead of building it again from its config. Records hold references to objects of the
model, never closures, so `deepcopy` and `torch.save` of the model copy a working patch.

The site installers (`hf_posenc.sites`) record into a PatchState; `hf_posenc.patching` drives it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn
from transformers import PretrainedConfig

from .config import PosEncConfig

STATE_ATTR = "_posenc_state"  # the model attribute that holds its PatchState


class Missing:
    """Marks an attribute that did not exist (a class, so `deepcopy` and pickling keep its identity)."""


def _get(obj: Any, name: str, instance: bool) -> Any:
    if instance:
        return vars(obj).get(name, Missing)
    return getattr(obj, name, Missing) if hasattr(obj, name) else Missing


@dataclass
class Restore:
    """Swap `obj.name` with `held` (`Missing`: the attribute is deleted). `instance` looks at the
    instance's own attributes only, so shadowing a class method is undone by deleting the shadow."""

    obj: Any
    name: str
    held: Any
    instance: bool = False

    def __call__(self) -> None:
        current = _get(self.obj, self.name, self.instance)
        if self.held is Missing:
            delattr(self.obj, self.name)
        else:
            setattr(self.obj, self.name, self.held)
        self.held = current


# (module, which hook dict, key, hook, in the with-kwargs set, in the always-called set, key order of the dict)
_Detached = tuple[nn.Module, str, int, Any, bool, bool, list[int]]
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")


@dataclass
class RemoveHooks:
    """Takes every patch hook (`kind`) off `root` and its submodules, wherever wrappers have moved the
    modules since (a handle would point at one module), and keeps them; called again, re-registers the
    same hook objects under their keys, in their order."""

    root: nn.Module
    kind: type
    detached: list[_Detached] | None = None  # None: the hooks are on the model

    def __call__(self) -> None:
        if self.detached is None:
            self.detached = [item for module in self.root.modules() for item in _take(module, self.kind)]
            return
        for module, dict_name, key, hook, with_kwargs, always, order in self.detached:
            hooks = getattr(module, dict_name)
            hooks[key] = hook
            pre = dict_name == "_forward_pre_hooks"
            if with_kwargs:
                (module._forward_pre_hooks_with_kwargs if pre else module._forward_hooks_with_kwargs)[key] = True
            if always:
                module._forward_hooks_always_called[key] = True
            for k in [k for k in order if k in hooks] + [k for k in list(hooks) if k not in order]:
                hooks.move_to_end(k)
        self.detached = None


def _take(module: nn.Module, kind: type) -> list[_Detached]:
    taken: list[_Detached] = []
    for dict_name in _HOOK_DICTS:
        hooks = getattr(module, dict_name)
        order = list(hooks)
        pre = dict_name == "_forward_pre_hooks"
        kwargs_set = module._forward_pre_hooks_with_kwargs if pre else module._forward_hooks_with_kwargs
        for key in [key for key, hook in hooks.items() if isinstance(hook, kind)]:
            always = not pre and module._forward_hooks_always_called.pop(key, False)
            taken.append((module, dict_name, key, hooks.pop(key), bool(kwargs_set.pop(key, False)), always, order))
    return taken


@dataclass
class PatchState:
    """What is patched now and how to take it back (and put it back): a list of swap records."""

    config: PosEncConfig
    undo: list[Callable[[], None]] = field(default_factory=list)
    new_modules: list[str] = field(default_factory=list)  # paths from the base model, resolved when asked
    config_only: bool = False  # plain transformers rebuilds the patched model from its config (writing.mark_folder)
    # what an installer did that the record reads, reported by it: the model's own transformers rotary class
    # rebuilt from new `rope_parameters` in the config (sites.qk), nothing else of the positions changed
    rebuilt_rotary: bool = False
    notes: dict[str, Any] = field(default_factory=dict)  # what an install measured, recorded in config.posenc
    # the model as read before its patch (`hf_posenc.view.StockRead`), so reading a patched model never unpatches it;
    # None in a state pickled before patches kept it (the view reads that once, patch off)
    stock: Any = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A state pickled before `native` was named `config_only` (torch.save of a patched model) reads alike."""
        self.__dict__.update({("config_only" if k == "native" else k): v for k, v in state.items()})

    def set_attr(self, obj: Any, name: str, value: Any, instance: bool = False) -> None:
        self.undo.append(Restore(obj, name, _get(obj, name, instance), instance))
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
        self.undo.append(Restore(parent, name, Missing))
        if new:
            self.new_modules.append(path)

    def rollback(self) -> None:
        """Undo every change, last first; the records then hold the patch's objects for `reapply`."""
        for record in reversed(self.undo):
            record()

    def reapply(self) -> None:
        """Put back, first to last, the same objects `rollback` took off."""
        for record in self.undo:
            record()


def convert_held(model: nn.Module, state: PatchState, fn: Callable, recurse: bool = True) -> nn.Module:
    """`Module._apply` of a patched model (what `.to()`, `.half()`, `.cuda()` call): its modules, then the stock
    modules its patch took out and holds, so that `unpatch` puts them back on the model's device and dtype."""
    type(model)._apply(model, fn, recurse)
    for record in state.undo:
        if isinstance(record, Restore) and isinstance(record.held, nn.Module):
            record.held._apply(fn, recurse)
    return model


def own_config(model: nn.Module) -> list[Restore]:
    """Give `model` a config of its own, a copy of the one it holds now, and return the records that give that
    one back. transformers hands one config object to every model built from it (and it is the caller's own), so
    a patch that wrote into it would change them all. Every module that held the config, or one of its
    sub-configs, holds the copy's. A patch takes a copy each time (edits made to a patched model's config since
    stay) and keeps it when unpatched: the model's config then equals what it was, and is still its own."""
    memo: dict[int, Any] = {}
    copy.deepcopy(model.config, memo)
    records = []
    for module in model.modules():
        config = vars(module).get("config")
        if isinstance(config, PretrainedConfig) and id(config) in memo:
            records.append(Restore(module, "config", config, instance=True))
            setattr(module, "config", memo[id(config)])
    return records
