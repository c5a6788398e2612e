"""The study's arms: one positional scheme each on the same tiny GPT-2-shaped decoder, as data.

First tier: the five schemes of Kazemnejad et al. (2023) -- `nope`, `t5`, `alibi`, `rope_partial` (their Rotary:
25% of each head's dimensions rotate), `sinusoidal` (their APE) -- and `rope` (all dimensions), `learned` (GPT-2's
own table), `concat` (positions in the complement of the tokens' subspace), `untied` (TUPE). Second tier: the
schemes that followed: `fire`, `kerple`, `xpos`, `p_rope`, `pope`, `cope`.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Arm:
    """scheme: what `hf_posenc.patch` installs (None: GPT-2's own learned table); table: its positions are rows of a
    table of the model's `positions` (inputs past it cannot run, and training past it is refused); added: position
    vectors enter the residual stream, so the subspace geometry and the four attention terms are measured."""

    scheme: str | None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    tier: int = 1
    table: bool = False
    added: bool = False


def arms(width: int) -> dict[str, Arm]:
    """Every arm, for a model of this width."""
    return {
        "nope": Arm("nope"),
        "t5": Arm("t5"),
        "alibi": Arm("alibi"),
        "rope": Arm("rope"),
        "rope_partial": Arm("rope", {"partial": 0.25}),
        "sinusoidal": Arm("sinusoidal", added=True),
        "learned": Arm(None, table=True, added=True),
        "concat": Arm("concat", {"d_pos": width // 4}, added=True),
        "untied": Arm("untied"),
        "fire": Arm("fire", tier=2),
        "kerple": Arm("kerple", tier=2),
        "xpos": Arm("xpos", tier=2),
        "p_rope": Arm("p_rope", {"p": 0.5}, tier=2),
        "pope": Arm("pope", tier=2),
        "cope": Arm("cope", tier=2),
    }
