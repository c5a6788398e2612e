"""`t5`: a learned scalar per (head, log-bucketed distance), shared by all layers as T5 shares its table
(Raffel et al. 2020, sec. 2.1). Starts at zero bias unless asked otherwise: a fresh patch is NoPE."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..domains import Relation, at_least, one_of, option
from .base import BiasScheme, ModelFacts, OwnParameters, RelativeBias, loaded, register_scheme


T5_INITS = ("copy", "normal", "zeros")


@dataclass(frozen=True)
class T5Options:
    num_buckets: int | None = option(None, "relative-position buckets; default: the model's own (T5), else 32",
                                     at_least(4, int, "half exact, half log"))
    max_distance: int | None = option(None, "distance at which buckets stop growing; default: the model's own, "
                                            "else 128; > num_buckets/2", at_least(1, int))
    init_std: float = option(0.0, "std of the initial table (init 'normal'); 0 starts as NoPE", at_least(0))
    init: str | None = option(None, f"one of {T5_INITS}; default: copy the model's own table if it has one of "
                                     "this shape, else normal if init_std > 0, else zeros", one_of(*T5_INITS))

    # a default (None) is the model's own, checked once resolved against it (patching.validate)
    relations = (Relation("max_distance", ">", "num_buckets", "max_distance must be an int > num_buckets/2 = {bound}, "
                          "got {max_distance!r}", times=0.5),)


def t5_bucket(distance: torch.Tensor, causal: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Half the buckets are exact small distances, the rest grow logarithmically up to max_distance;
    bidirectional models spend half of them on keys after the query. Float arithmetic until the end
    (exact for integers): the CPU flex kernel miscompiles an int64 `where`."""
    n, offset = distance.float(), 0.0
    if causal:
        n = n.clamp(min=0)
    else:
        num_buckets //= 2
        offset = (n < 0).float() * num_buckets  # key after query
        n = n.abs()
    exact = num_buckets // 2
    log_ratio = torch.log(n.clamp(min=1) / exact) / math.log(max_distance / exact)
    large = (exact + torch.floor(log_ratio * (num_buckets - exact))).clamp(max=num_buckets - 1)
    return (offset + torch.where(n < exact, n, large)).long()


class T5Bias(RelativeBias, OwnParameters):
    def __init__(self, heads: int, causal: bool, num_buckets: int, max_distance: int, init_std: float,
                 table: torch.Tensor | None = None) -> None:
        super().__init__()
        self.heads, self.causal, self.num_buckets, self.max_distance = heads, causal, num_buckets, max_distance
        # a copied table is drawn again (a model built on meta, nothing loaded) with the spread it had
        self.init_std = float(table.float().std()) if table is not None and table.numel() > 1 else init_std
        self.relative_attention_bias = nn.Embedding(num_buckets, heads)
        self.reset_parameters()
        if table is not None:
            with torch.no_grad():
                self.relative_attention_bias.weight.copy_(table)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The bucket table N(0, init_std^2), zeros at init_std=0 (unless loaded)."""
        weight = self.relative_attention_bias.weight
        if not loaded(weight):
            weight.normal_(0.0, self.init_std) if self.init_std else weight.zero_()

    def by_distance(self, head: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        bucket = t5_bucket(distance, self.causal, self.num_buckets, self.max_distance)
        return self.relative_attention_bias.weight[bucket, head].float()


class T5(BiasScheme):
    name = "t5"
    Options = T5Options
    citation = "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5), section 2.1"
    test_settings = {"t5": {"init_std": 0.5}}

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out, own = dict(options), facts.bias_table
        out["num_buckets"] = out["num_buckets"] or (own.shape[0] if own is not None else 32)
        out["max_distance"] = out["max_distance"] or facts.bias_max_distance or 128
        fits = own is not None and tuple(own.shape) == (out["num_buckets"], facts.num_heads)
        if out["init"] == "copy" and not fits:
            from ..errors import PosEncError

            raise PosEncError(f"t5 init='copy' needs the model's own bucket table of shape ({out['num_buckets']}, "
                              f"{facts.num_heads}); this model has {tuple(own.shape) if own is not None else 'none'}")
        out["init"] = out["init"] or ("copy" if fits and not out["init_std"] else "normal" if out["init_std"] else "zeros")
        return out

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        table = facts.bias_table if options["init"] == "copy" else None
        std = options["init_std"] if options["init"] == "normal" else 0.0
        return T5Bias(facts.num_heads, facts.causal, options["num_buckets"], options["max_distance"], std, table)


register_scheme(T5())
