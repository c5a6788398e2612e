"""Embedding site (schemes of site "input": learned, sinusoidal, concat): a position code added to the token
embeddings.

Models with a position-embedding slot get the code in the slot (called with position ids; a slot the model
calls with other arguments gets them from a pre-hook, `sites.base.SlotIds`); others get it as
`posenc_positions` on the loop owner, added to the token embeddings by the layer-loop hook. `concat` also projects the
token embeddings (and BERT's token types) onto their own subspace with a forward hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..attention import Positions
from ..schemes.building import built
from .base import LayerLoop, PatchHook, remove_native_positions
from .entry import Entry, rotary_off

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..schemes.base import Scheme
    from ..state import PatchState

INPUT_MODULE = "posenc_positions"  # where the code lives on a model without a position slot
KIND = "absolute"  # what analysis calls the positions of this site
TITLE = "input embeddings"  # what a model card calls it
PROBE = ("learned", {"init": "normal"})  # the scheme standing for this site in the self-check's "takes effect"


def needs(adapter: Adapter, spec: Scheme) -> list[str]:
    """The mechanisms (adapters.base.MECHANISMS) an input code needs: the position slot's place, else the loop."""
    return (["slot", "slot_code"] if adapter.slot else ["input"]) + \
        rotary_off(adapter)


class AddCode:
    """Contribution: token embeddings plus the code of the module at `path` for the query positions."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, owner: nn.Module, kwargs: dict[str, Any], positions: Positions) -> None:
        if kwargs.get("inputs_embeds") is None:
            kwargs["inputs_embeds"] = owner.get_input_embeddings()(kwargs.pop("input_ids"))
            kwargs["input_ids"] = None
        kwargs["inputs_embeds"] = kwargs["inputs_embeds"] + owner.get_submodule(self.path)(positions.queries)


class ProjectTokens(PatchHook):
    """Forward hook on a token embedding: keeps tokens in their own subspace. It holds the code module
    itself, not a path: the projection uses only its fixed basis buffer, which no training changes, so a
    peft copy or wrapper of either module projects the same way."""

    def __init__(self, code: nn.Module) -> None:
        self.code = code

    def __call__(self, embedding: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return self.code.project_tokens(output)


def install(model: nn.Module, entry: Entry, state: PatchState, loop: LayerLoop) -> None:
    base, adapter = model.base_model, entry.adapter
    code = built(entry.spec, entry.config.options, entry.facts)
    if adapter.slot:
        state.replace(base, adapter.slot.path, code)
    else:
        state.add_module(base, adapter.at_loop(INPUT_MODULE), code, new=True)
        loop.contributions.append(AddCode(INPUT_MODULE))
    state.notes.update(getattr(code, "notes", {}))
    if hasattr(code, "project_tokens"):
        for path in adapter.embeddings.other:
            base.get_submodule(path).register_forward_hook(ProjectTokens(code))
        model.get_input_embeddings().register_forward_hook(ProjectTokens(code))
    remove_native_positions(model, entry, state, keep_slot=True)
