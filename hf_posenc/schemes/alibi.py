"""`alibi`: linear distance penalties on attention scores (Press et al. 2022, "Train Short, Test Long").

Head h of n gets slope m_h; the logit of query i for key j gets -m_h * |i - j| (the absolute value
makes it usable in bidirectional encoders too, as in Press et al.'s follow-ups and MPT/BERT-ALiBi).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..domains import option, positive
from .base import BiasScheme, DerivedBuffers, ModelFacts, RelativeBias, register_scheme


@dataclass(frozen=True)
class AlibiOptions:
    max_bias: float = option(8.0, "slopes are 2^(-max_bias*h/H); 8 in Press et al. 2022", positive("Press et al. 2022"))
    scale: float | None = option(None, "multiplies every slope; default: the model's own ALiBi's (Falcon divides "
                                       "by sqrt(head_dim)), else 1", positive())


def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> torch.Tensor:
    """Geometric slopes 2^(-max_bias*h/n) for n a power of two; otherwise the n' = 2^floor(log2 n)
    sequence followed by every other slope of the 2n' sequence (Press et al. 2022, appendix)."""

    def geometric(n: int) -> list[float]:
        return [2 ** (-max_bias * (h + 1) / n) for h in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(closest) + geometric(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class AlibiBias(RelativeBias, DerivedBuffers):
    """The slopes as a module (a buffer, not saved), so ALiBi has the same elementwise contract as
    the learned biases: -m_h |i - j| for any broadcastable head / position tensors."""

    def __init__(self, num_heads: int, max_bias: float, scale: float = 1.0) -> None:
        super().__init__()
        self.heads, self.max_bias, self.scale = num_heads, max_bias, scale
        self.register_derived()

    def derived(self) -> dict[str, torch.Tensor]:
        return {"slopes": alibi_slopes(self.heads, self.max_bias) * self.scale}

    def by_distance(self, head: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        return -self.slopes[head] * distance.abs().float()


class Alibi(BiasScheme):
    name = "alibi"
    Options = AlibiOptions
    citation = "Press et al. 2022, Train Short, Test Long: Attention with Linear Biases"
    test_settings = {"alibi": {}, "alibi-l1": {"layers": [1]}}
    served = True

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        """`scale` left as None takes the model's own, so patching a model's own ALiBi leaves it as it was."""
        return {**options, "scale": float(options["scale"] if options["scale"] is not None else facts.alibi_scale)}

    def distance_slopes(self, options: dict[str, Any], num_heads: int) -> torch.Tensor:
        scale = options.get("scale") or 1.0  # configs saved before the option existed
        return alibi_slopes(num_heads, options["max_bias"]) * scale

    def module(self, options: dict[str, Any], facts: ModelFacts) -> AlibiBias:
        """The bias as a module, as the learned schemes give theirs: what fused attention paths evaluate."""
        return AlibiBias(facts.num_heads, options["max_bias"], options["scale"])


register_scheme(Alibi())
