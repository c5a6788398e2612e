"""What a patch leaves on the model as a whole, once its plan is installed: `config.posenc` (the config the folder
reloads from), `save_pretrained` (folders that load back patched, `hf_posenc.writing`), the model's init (which
draws the patch's parameters and derives its buffers again), and, when plain transformers can rebuild the patched
model from its config alone, the stock values of what the patch changed in that config. Recorded in the patch's state, like every
change the sites make, so `unpatch` takes it back."""

from __future__ import annotations

import copy
import functools
from typing import Any

from torch import nn

from . import compat, writing
from .config import BEFORE
from .plan import Plan
from .schemes.base import initialise
from .state import Missing, PatchState, Restore


def record(model: nn.Module, plan: Plan, state: PatchState) -> None:
    """Record the installed `plan` on `model` (the transformers model, an encoder-decoder's included)."""
    notes = {"notes": state.notes} if state.notes else {}
    state.set_attr(model.config, "posenc", {**plan.config.to_dict(original=plan.native), **notes})
    state.set_attr(model, "save_pretrained", functools.partial(writing.save_pretrained, model), instance=True)
    if callable(getattr(type(model), "initialize_weights", None)):
        state.set_attr(model, "initialize_weights", functools.partial(initialize_weights, model), instance=True)
    # plain transformers rebuilds the model from its config alone when the installer reports that it rebuilt the
    # model's own rotary module from new `rope_parameters` (a q/k entry of a per-layer map never does), which no
    # hook, bias or weight does; an encoder-decoder's stacks keep their own configs
    state.config_only = plan.stacks[0].name is None and state.rebuilt_rotary
    if state.config_only:
        record_before(model.config, state)


def initialize_weights(model: nn.Module) -> None:
    """A patched model's `initialize_weights` (what `init_weights` and transformers' loading call): the class's
    own, then the parameters and buffers of the patch's modules, which the class's init does not know or draws with
    its own std (a model built on the meta device has them empty after `to_empty`)."""
    type(model).initialize_weights(model)
    initialise(model)
    for module in model.modules():  # the rotary modules the patch put in, as transformers' own
        if isinstance(module, compat.rotary_module_class()):
            compat.rederive_rotary(module)


def record_before(config: Any, state: PatchState) -> None:
    """Put what the config-only patch changed in the model's (text) config, as it was, into `config.posenc`: the folder
    then loads in hf-posenc as the model before the patch, patched again, and `unpatch` gives the stock positions
    back (with only the patched fields, the loaded model's "stock" would be the patched one)."""
    text = compat.text_config(config)
    before = {r.name: copy.deepcopy(r.held) for r in state.undo
              if isinstance(r, Restore) and r.obj is text and r.name != "posenc" and r.held is not Missing}
    state.set_attr(config, "posenc", {**config.posenc, BEFORE: before})


__all__ = ["initialize_weights", "record"]
