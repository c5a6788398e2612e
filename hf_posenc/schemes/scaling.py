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

from typing import Any

from ..domains import rotary_pairs
from ..options.rotary import Llama3Options, LongRopeOptions, ScalingOptions, YarnOptions
from ..registry import register_scheme
from .base import ModelFacts, RotaryScheme
from .rope import resolve_rotation


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
            pairs = rotary_pairs(facts.named(), out)  # what the lists' domains name (checked before resolve)
            out["short_factor"] = out["short_factor"] or [1.0] * pairs
            out["long_factor"] = out["long_factor"] or [out["factor"]] * pairs
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
