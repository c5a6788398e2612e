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

from ..config import check, option
from ..registry import register_scheme
from .base import ModelFacts, RotaryScheme
from .rope import check_rope_options, resolve_rotation


@dataclass(frozen=True)
class ScalingOptions:
    factor: float = option(None, "context extension factor (>= 1); required")
    original_max_position_embeddings: int | None = option(None, "trained length; default: the model's own")
    theta: float | None = option(None, "rotary base; default: the model's own, else 10000")
    partial: float | None = option(None, "rotating fraction of head dims in (0, 1]; default: model's own or 1")

    def __post_init__(self) -> None:
        check(isinstance(self.factor, (int, float)), "option 'factor' is required (a number >= 1)")
        check(self.factor >= 1, f"factor must be >= 1, got {self.factor!r}")
        omp = self.original_max_position_embeddings
        check(omp is None or (isinstance(omp, int) and omp > 0),
              f"original_max_position_embeddings must be a positive int, got {omp!r}")
        check_rope_options(self.theta, self.partial)


@dataclass(frozen=True)
class YarnOptions(ScalingOptions):
    beta_fast: float = option(32.0, "YaRN ramp: wavelengths shorter than L/beta_fast are extrapolated")
    beta_slow: float = option(1.0, "YaRN ramp: wavelengths longer than L/beta_slow are interpolated")
    attention_factor: float | None = option(None, "logit temperature; default 0.1*ln(factor)+1 (YaRN eq. 22)")


@dataclass(frozen=True)
class Llama3Options(ScalingOptions):
    low_freq_factor: float = option(1.0, "Llama 3.1 low-frequency factor")
    high_freq_factor: float = option(4.0, "Llama 3.1 high-frequency factor")


@dataclass(frozen=True)
class LongRopeOptions(ScalingOptions):
    short_factor: list[float] | None = option(None, "per-frequency factors within the trained length; default 1s")
    long_factor: list[float] | None = option(None, "per-frequency factors beyond it; default `factor` for all")


class Scaling(RotaryScheme):
    Options = ScalingOptions
    rope_type: str
    extra: tuple[str, ...] = ()

    def __init__(self, name: str, rope_type: str, options: type, extra: tuple[str, ...], citation: str) -> None:
        self.name, self.rope_type, self.Options, self.extra, self.citation = name, rope_type, options, extra, citation

    def resolve(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        out = resolve_rotation(options, facts)
        out["factor"] = float(out["factor"])
        native_omp = (facts.rope_parameters or {}).get("original_max_position_embeddings")
        out["original_max_position_embeddings"] = out["original_max_position_embeddings"] or native_omp or facts.max_positions
        if self.rope_type == "longrope":
            pairs = int(facts.head_dim * out["partial"]) // 2
            out["short_factor"] = out["short_factor"] or [1.0] * pairs
            out["long_factor"] = out["long_factor"] or [out["factor"]] * pairs
            for key in ("short_factor", "long_factor"):
                check(len(out[key]) == pairs, f"{key} must have {pairs} entries (head_dim*partial/2), got {len(out[key])}")
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


class Ntk(Scaling):
    """Static NTK-aware scaling is plain RoPE with a larger base, so it loads anywhere."""

    def rope_parameters(self, options: dict[str, Any], facts: ModelFacts) -> dict[str, Any]:
        dim = 2 * (int(facts.head_dim * options["partial"]) // 2)
        theta = options["theta"] * options["factor"] ** (dim / (dim - 2))
        return {"rope_type": "default", "rope_theta": theta}


register_scheme(Scaling("linear", "linear", ScalingOptions, (), "Chen et al. 2023, Extending Context Window of LLMs via Position Interpolation"))
register_scheme(Scaling("dynamic", "dynamic", ScalingOptions, (), "emozilla 2023, Dynamically Scaled RoPE; Peng et al. 2023"))
register_scheme(Scaling("yarn", "yarn", YarnOptions, ("beta_fast", "beta_slow", "attention_factor"), "Peng et al. 2023, YaRN"))
register_scheme(Scaling("llama3", "llama3", Llama3Options, ("low_freq_factor", "high_freq_factor"), "Meta 2024, Llama 3.1"))
register_scheme(Scaling("longrope", "longrope", LongRopeOptions, ("short_factor", "long_factor"), "Ding et al. 2024, LongRoPE"))
register_scheme(Ntk("ntk", "default", ScalingOptions, (), "bloc97 2023, NTK-aware scaled RoPE; Peng et al. 2023 eq. 16"))
