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
from ..schemes.base import ModelFacts, Scheme
from .base import LayerLoop, PatchHook, built, remove_native_positions

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..state import PatchState

INPUT_MODULE = "posenc_positions"  # where the code lives on a model without a position slot


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


def install(model: nn.Module, adapter: Adapter, spec: Scheme, facts: ModelFacts, state: PatchState,
            loop: LayerLoop) -> None:
    base = model.base_model
    code = built(spec, state.config.options, facts)
    if adapter.position_slot:
        state.replace(base, adapter.position_slot, code)
    else:
        state.add_module(base, adapter.at_loop(INPUT_MODULE), code, new=True)
        loop.contributions.append(AddCode(INPUT_MODULE))
    if notes := getattr(code, "notes", None):
        model.config.posenc["notes"] = notes
    if hasattr(code, "project_tokens"):
        for path in adapter.other_embeddings:
            base.get_submodule(path).register_forward_hook(ProjectTokens(code))
        model.get_input_embeddings().register_forward_hook(ProjectTokens(code))
    remove_native_positions(model, adapter, facts, state, keep_slot=True)
