"""`rope`: rotary position embedding (Su et al. 2021, RoFormer), with a partial fraction.

The rotation uses the rotate-half layout of transformers (pairs (i, i + d/2)). A partial RoPE
keeps the first `partial * d/2` frequency pairs and leaves the others unrotated (cos=1, sin=0),
which is GPT-NeoX-style partial rotation up to a fixed permutation of the head dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..domains import between, option, positive
from .base import ModelFacts, RotaryScheme, register_scheme
from .rotary import Rotary


THETA = positive("RoFormer: frequencies theta^(-2i/d)")
PARTIAL = between(0, 1, low_open=True, source="GPT-NeoX rotary_pct")


@dataclass(frozen=True)
class RopeOptions:
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


def native_theta(facts: ModelFacts) -> float:
    return float((facts.rope_parameters or {}).get("rope_theta", 10_000.0))


def native_partial(facts: ModelFacts) -> float:
    return facts.partial


def resolve_rotation(options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
    """`theta` and `partial` left as None take the model's own (or 10000 and 1 on a model that had none)."""
    theta = options["theta"] if options["theta"] is not None else native_theta(facts)
    partial = options["partial"] if options["partial"] is not None else native_partial(facts)
    return {**options, "theta": float(theta), "partial": float(partial)}


def plain_rotary(options: dict[str, Any], facts: ModelFacts) -> Rotary:
    """Unscaled RoPE with the resolved `theta` and `partial`, for schemes that rotate inside attention."""
    return Rotary(facts.head_dim, {"rope_type": "default", "rope_theta": options["theta"]}, options["partial"],
                  facts.max_positions)


class Rope(RotaryScheme):
    name = "rope"
    Options = RopeOptions
    citation = "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding"
    test_settings = {"rope": {"theta": 500.0}, "rope-partial": {"partial": 0.5},
                     "rope-l0": {"theta": 500.0, "layers": [0]}}  # on a rotating model: two thetas, one per layer
    served = True

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        return resolve_rotation(options, facts)

    def rope_parameters(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        return {"rope_type": "default", "rope_theta": options["theta"]}


register_scheme(Rope())
