"""What the installers are handed: a patch plan's stacks (`StackPlan`, built by `hf_posenc.plan`), each holding the
entries of one stack, and an entry (`Entry`), what one site installer reads.

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



@dataclasses.dataclass(frozen=True)
class StackPlan:
    """One stack as a plan hands it to `sites.install`: its name (None: the model's one stack; else an
    encoder-decoder's "encoder" or "decoder"), its adapter, and the entries installed into it (`per_layer`: a
    per-layer map's, else one entry over every layer). Built whole by the plan: nothing fills it later."""

    name: str | None
    adapter: Adapter
    entries: tuple[Entry, ...]
    per_layer: bool = False

def slot_needs(adapter: Adapter) -> list[str]:
    """The mechanism every site but the input one needs on a model with a position slot it takes away."""
    return ["slot"] if adapter.slot else []


def rotary_off(adapter: Adapter) -> list[str]:
    """The mechanism every site but q/k needs on a natively rotating model."""
    return ["rotary_off"] if adapter.rotation else []
