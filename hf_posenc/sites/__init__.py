"""One installer per site; each joins a scheme's maths to one model at the places its adapter names.

The scheme's `site` names the installer: "input" -> `embedding` (a position-embedding module), "qk" -> `qk`
(rotations of q and k), "score" -> `score` (a bias on the attention scores), "attention" -> `logits` (the q.k
logits computed by the scheme), "none" -> removal only. `model` installs into one model, `stacks` into the
stacks of an encoder-decoder model.

An installer takes `(model, adapter, scheme, facts, state, loop)`, records every change in `state` and
adds what the layer-loop hook must pass down to `loop`; a new site is a new module here, not a new
branch in `patching`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from torch import nn

from . import embedding, logits, qk, score
from .base import (CarryKwargs, HandSlotIds, KeepPositionIds, LayerLoop, RecordPositions, RelayKwargs, remove_hooks,
                   remove_native_positions)

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..state import PatchState
    from ..schemes.base import ModelFacts, Scheme


def _none(model: nn.Module, adapter: Adapter, spec: Scheme, facts: ModelFacts, state: PatchState,
          loop: LayerLoop) -> None:
    remove_native_positions(model, adapter, facts, state)


INSTALLERS: dict[str, Callable[..., None]] = {
    "input": embedding.install,
    "qk": qk.install,
    "score": score.install,
    "attention": logits.install,
    "none": _none,
}

__all__ = ["INSTALLERS", "CarryKwargs", "HandSlotIds", "KeepPositionIds", "LayerLoop", "RecordPositions", "RelayKwargs",
           "remove_hooks"]
