"""RoPE scalings for longer context, all through transformers' `ROPE_INIT_FUNCTIONS`:

- `linear`: position interpolation (Chen et al. 2023)
- `ntk`: NTK-aware base change theta' = theta * s^(d/(d-2)) (bloc97 2023; as stated in Peng et al. 2023, eq. 16)
- `dynamic`: dynamic NTK, the base grows with the sequence past the original length
- `yarn`: YaRN (Peng et al. 2023), NTK-by-parts + attention temperature
- `llama3`: Llama 3.1 frequency-dependent scaling (Meta 2024)
- `longrope`: LongRoPE (Ding et al. 2024), per-frequency factors
On a model that already rotates they only change `config.rope_parameters`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..domains import Domain, Relation, at_least, option, positive, rotary_pairs
from .base import ModelFacts, RotaryScheme, register_scheme
from .rope import PARTIAL, THETA, resolve_rotation


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

    relations = (Relation("beta_slow", "<", "beta_fast", "beta_slow must be < beta_fast (YaRN's ramp), got "
                          "beta_slow={beta_slow!r}, beta_fast={beta_fast!r}"),)


@dataclass(frozen=True)
class Llama3Options(ScalingOptions):
    low_freq_factor: float = option(1.0, "Llama 3.1 low-frequency factor; < high_freq_factor", positive())
    high_freq_factor: float = option(4.0, "Llama 3.1 high-frequency factor", positive())

    relations = (Relation("low_freq_factor", "<", "high_freq_factor", "low_freq_factor must be < high_freq_factor "
                          "(Llama 3.1's smoothing divides by their difference), got {low_freq_factor!r} and "
                          "{high_freq_factor!r}"),)


@dataclass(frozen=True)
class LongRopeOptions(ScalingOptions):
    short_factor: list[float] | None = option(
        None, "per-frequency factors within the trained length, head_dim*partial/2 of them; default 1s",
        Domain(list, low=0, low_open=True, source="Ding et al. 2024", entries="rotary_pairs"))
    long_factor: list[float] | None = option(
        None, "per-frequency factors beyond it, head_dim*partial/2 of them; default `factor` for all",
        Domain(list, low=0, low_open=True, source="Ding et al. 2024", entries="rotary_pairs"))


class Scaling(RotaryScheme):
    Options = ScalingOptions
    rope_type: str
    extra: tuple[str, ...] = ()

    def __init__(self, name: str, rope_type: str, options: type, extra: tuple[str, ...], citation: str,
                 factor: float, served: bool = False) -> None:
        self.name, self.rope_type, self.Options, self.extra, self.citation = name, rope_type, options, extra, citation
        self.test_settings = {name: {"factor": factor}}  # `factor` has no default
        self.served = served

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out = resolve_rotation(options, facts)
        out["factor"] = float(out["factor"])
        native_omp = (facts.rope_parameters or {}).get("original_max_position_embeddings")
        out["original_max_position_embeddings"] = out["original_max_position_embeddings"] or native_omp or facts.max_positions
        return out

    def max_positions(self, options: dict[str, Any]) -> int | None:
        return int(options["original_max_position_embeddings"] * options["factor"])

    def rope_parameters(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        params = {
            "rope_type": self.rope_type,
            "rope_theta": options["theta"],
            "factor": options["factor"],
            "original_max_position_embeddings": options["original_max_position_embeddings"],
        }
        params.update({k: options[k] for k in self.extra if options[k] is not None})
        return params


class LongRope(Scaling):
    """Per-frequency factors, one per rotated pair: 1 within the trained length and `factor` beyond it unless given."""

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out = super().resolve(options, facts)
        pairs = rotary_pairs(facts.named(), out)  # what the lists' domains name (checked before resolve)
        out["short_factor"] = out["short_factor"] or [1.0] * pairs
        out["long_factor"] = out["long_factor"] or [out["factor"]] * pairs
        return out


class Ntk(Scaling):
    """Static NTK-aware scaling is plain RoPE with a larger base, so it loads anywhere."""

    def rope_parameters(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        dim = 2 * (int(facts.head_dim * options["partial"]) // 2)
        theta = options["theta"] * options["factor"] ** (dim / (dim - 2))
        return {"rope_type": "default", "rope_theta": theta}


register_scheme(Scaling("linear", "linear", ScalingOptions, (),
                        "Chen et al. 2023, Extending Context Window of LLMs via Position Interpolation", 2.0))
register_scheme(Scaling("dynamic", "dynamic", ScalingOptions, (),
                        "emozilla 2023, Dynamically Scaled RoPE; Peng et al. 2023", 2.0))
register_scheme(Scaling("yarn", "yarn", YarnOptions, ("beta_fast", "beta_slow", "attention_factor"),
                        "Peng et al. 2023, YaRN", 4.0, served=True))
register_scheme(Scaling("llama3", "llama3", Llama3Options, ("low_freq_factor", "high_freq_factor"),
                        "Meta 2024, Llama 3.1", 4.0))
register_scheme(LongRope("longrope", "longrope", LongRopeOptions, ("short_factor", "long_factor"),
                         "Ding et al. 2024, LongRoPE", 2.0))
register_scheme(Ntk("ntk", "default", ScalingOptions, (), "bloc97 2023, NTK-aware scaled RoPE; Peng et al. 2023 eq. 16",
                    2.0))
