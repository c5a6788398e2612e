"""Options of the rotary schemes: rope and its scalings (linear, ntk, dynamic, yarn, llama3, longrope),
Self-Extend and xPos. Ranges follow the papers and transformers' `rope_config_validation`."""

from __future__ import annotations

from dataclasses import dataclass

from ..domains import Domain, at_least, between, check, option, positive

THETA = positive("RoFormer: frequencies theta^(-2i/d)")
PARTIAL = between(0, 1, low_open=True, source="GPT-NeoX rotary_pct")


@dataclass(frozen=True)
class RopeOptions:
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "fraction of each head's dims that rotate; default: model's own or 1", PARTIAL)


@dataclass(frozen=True)
class ScalingOptions:
    factor: float = option(None, "context extension factor; required", at_least(1, source="Chen et al. 2023: s >= 1"))
    original_max_position_embeddings: int | None = option(None, "trained length; default: the model's own",
                                                          at_least(1, int))
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "rotating fraction of head dims; default: model's own or 1", PARTIAL)


@dataclass(frozen=True)
class YarnOptions(ScalingOptions):
    beta_fast: float = option(32.0, "YaRN ramp: wavelengths shorter than L/beta_fast are extrapolated",
                              positive("Peng et al. 2023, sec. 3.2: alpha < beta"))
    beta_slow: float = option(1.0, "YaRN ramp: wavelengths longer than L/beta_slow are interpolated; < beta_fast",
                              positive("Peng et al. 2023, sec. 3.2"))
    attention_factor: float | None = option(None, "logit temperature; default 0.1*ln(factor)+1 (YaRN eq. 22)",
                                            positive())

    def __post_init__(self) -> None:
        check(self.beta_slow < self.beta_fast,
              f"beta_slow must be < beta_fast (YaRN's ramp), got beta_slow={self.beta_slow!r}, "
              f"beta_fast={self.beta_fast!r}")


@dataclass(frozen=True)
class Llama3Options(ScalingOptions):
    low_freq_factor: float = option(1.0, "Llama 3.1 low-frequency factor; < high_freq_factor", positive())
    high_freq_factor: float = option(4.0, "Llama 3.1 high-frequency factor", positive())

    def __post_init__(self) -> None:
        check(self.low_freq_factor < self.high_freq_factor,
              f"low_freq_factor must be < high_freq_factor (Llama 3.1's smoothing divides by their difference), "
              f"got {self.low_freq_factor!r} and {self.high_freq_factor!r}")


@dataclass(frozen=True)
class LongRopeOptions(ScalingOptions):
    short_factor: list[float] | None = option(
        None, "per-frequency factors within the trained length, head_dim*partial/2 of them; default 1s",
        Domain(list, low=0, low_open=True, source="Ding et al. 2024", entries="rotary_pairs"))
    long_factor: list[float] | None = option(
        None, "per-frequency factors beyond it, head_dim*partial/2 of them; default `factor` for all",
        Domain(list, low=0, low_open=True, source="Ding et al. 2024", entries="rotary_pairs"))


@dataclass(frozen=True)
class SelfExtendOptions:
    group: int = option(4, "G: positions beyond the window are floor-divided by G (extends context ~G x)",
                        at_least(1, int, "Jin et al. 2024"))
    window: int = option(512, "W: neighbour window kept at exact relative positions", at_least(1, int))
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "rotating fraction of head dims; default: model's own or 1", PARTIAL)


@dataclass(frozen=True)
class XposOptions:
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000", THETA)
    partial: float | None = option(None, "rotating fraction of head dims; default: model's own or 1", PARTIAL)
    gamma: float = option(0.4, "zeta offset (0.4 in Sun et al.)", positive("Sun et al. 2022"))
    scale_base: float = option(512.0, "B: distance over which the decay acts (512 in Sun et al.)", positive())
