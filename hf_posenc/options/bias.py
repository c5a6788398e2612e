"""Options of the score-site schemes: ALiBi, T5 buckets, FIRE, KERPLE, TUPE (untied)."""

from __future__ import annotations

from dataclasses import dataclass

from ..domains import at_least, check, one_of, option, positive


@dataclass(frozen=True)
class AlibiOptions:
    max_bias: float = option(8.0, "slopes are 2^(-max_bias*h/H); 8 in Press et al. 2022", positive("Press et al. 2022"))
    scale: float | None = option(None, "multiplies every slope; default: the model's own ALiBi's (Falcon divides "
                                       "by sqrt(head_dim)), else 1", positive())


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

    def __post_init__(self) -> None:
        # a default (None) is the model's own, checked once resolved against it (patching.validate)
        check(self.max_distance is None or self.num_buckets is None or self.max_distance > self.num_buckets // 2,
              f"max_distance must be an int > num_buckets/2 = {(self.num_buckets or 0) // 2}, "
              f"got {self.max_distance!r}")


@dataclass(frozen=True)
class FireOptions:
    hidden: int = option(32, "width of the MLP f (32 in Li et al. 2023)", at_least(1, int))
    c: float = option(0.1, "initial c in psi(x) = log(c x + 1)", positive("Li et al. 2023"))
    threshold: float = option(512.0, "initial L: distances are normalised by psi(max(L, i))", positive())
    init: str = option("zeros", "'zeros' (output layer starts at 0: NoPE) or 'random'", one_of("zeros", "random"))


@dataclass(frozen=True)
class KerpleOptions:
    variant: str = option("log", "'log': -r1 log(1 + r2 d) or 'power': -r1 d^r2", one_of("log", "power"))
    r1: float = option(1.0, "initial r1 for every head", positive("Chi et al. 2022"))
    r2: float = option(1.0, "initial r2 for every head (power variant: <= 2)", positive("Chi et al. 2022"))

    def __post_init__(self) -> None:
        check(self.variant == "log" or self.r2 <= 2, f"power variant needs r2 <= 2 (Chi et al. 2022), got {self.r2!r}")


@dataclass(frozen=True)
class UntiedOptions:
    max_positions: int | None = option(None, "table length; default: the model's own max_position_embeddings",
                                       at_least(1, int))
    init_std: float = option(0.02, "std of the projections (and of the table when the model has none)", at_least(0))
