"""Removal site (schemes of site "none": NoPE): the model's own positions switched off, nothing put in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from .base import LayerLoop, remove_native_positions
from .entry import Entry, rotary_off, slot_needs

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..schemes.base import Scheme
    from ..state import PatchState

KIND = "none"  # what analysis calls the positions of this site
PROBE = ("nope", {})  # the scheme standing for this site in the self-check's "takes effect"


def needs(adapter: Adapter, spec: Scheme) -> list[str]:
    """The mechanisms (adapters.base.MECHANISMS) taking the model's own positions away needs."""
    return slot_needs(adapter) + rotary_off(adapter)


def install(model: nn.Module, entry: Entry, state: PatchState, loop: LayerLoop) -> None:
    remove_native_positions(model, entry, state)
