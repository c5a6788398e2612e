"""What a site installer is handed: one entry of a patch plan (`hf_posenc.plan`); the stacks that hold them are
`hf_posenc.view.Stack`s.

An entry is everything one install reads, so no installer looks anywhere else for it: the scheme, its config
with every option resolved, the adapter as this entry sees the model (a per-layer entry's view sees only its
layers), the stock facts of the model or stack it goes into, and what the plan found the scheme sets of them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..adapters.base import Adapter
    from ..config import PosEncConfig
    from ..schemes.base import ModelFacts, Scheme


@dataclasses.dataclass(frozen=True)
class Entry:
    """One scheme into some layers of one stack, resolved."""

    spec: Scheme
    config: PosEncConfig
    adapter: Adapter
    facts: ModelFacts
    max_positions: int | None = None  # the `max_position_embeddings` the scheme sets (None: the model's own stays)
    # a per-layer map's entry (sites.layers): the suffix of the modules and private kwargs it adds, and whether the
    # position slot keeps the model's own positions (for the layers outside the map)
    tag: str = ""
    keeps_slot: bool = False


def slot_needs(adapter: Adapter) -> list[str]:
    """The mechanism every site but the input one needs on a model with a position slot it takes away."""
    return ["slot"] if adapter.slot else []


def rotary_off(adapter: Adapter) -> list[str]:
    """The mechanism every site but q/k needs on a natively rotating model."""
    return ["rotary_off"] if adapter.rotation else []
