"""What llama.cpp must compute for a (patched) model, decided from its config alone: an architecture, its keys
and the `rope_freqs` tensor, or a refusal naming the scheme, the option and what llama.cpp lacks.

llama.cpp runs a GGUF by `general.architecture`, each a graph of its own (read in its source, confirmed by
tests/test_gguf.py with the real engine): `llama` rotates with `rope.freq_base`, a scaling type (none, linear,
yarn with its default ramp) and an optional per-frequency divisor `rope_freqs` (theta_i / rope_freqs[i]);
`refact` is Llama-shaped with ALiBi (max bias 8, no rotation) and no biases; `granite` switches the rotation off
in every layer when `rope.scaling.finetuned` is false (NoPE); `smollm3` leaves it off in every 4th layer. Every
scheme not in `TARGETS` is refused by name; what `TARGETS` maps is refused where an option goes past it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...catalog import get_scheme
from ...errors import PosEncError
from ...writing import stock_architectures
from ...schemes.base import ModelFacts
from ...schemes.rotary import Rotary

__all__ = ["FAMILIES", "REFUSED", "TARGETS", "Family", "Target", "target_of"]


@dataclass(frozen=True)
class Family:
    """A stock architecture as llama.cpp's converter writes it: its `llama`-like architecture name, whether q/k
    rows are permuted (the NORM rope layout), and whether its q/k/v biases are written."""

    arch: str
    permute: bool
    qkv_bias: bool = False


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama", permute=True),
    "MistralForCausalLM": Family("llama", permute=True),
    "Qwen2ForCausalLM": Family("qwen2", permute=False, qkv_bias=True),
}


@dataclass(frozen=True)
class Target:
    """One GGUF's positions: `arch` and its keys (without the `<arch>.` prefix); `rope_freqs`, if any, the
    per-pair divisors of RoPE's frequencies; `kept` says in words what llama.cpp computes."""

    arch: str
    keys: dict[str, Any] = field(default_factory=dict)
    rope_freqs: tuple[float, ...] | None = None
    kept: str = ""


@dataclass(frozen=True)
class Facts:
    """What a scheme's export needs of the config."""

    family: Family
    stock: str
    head_dim: int
    max_positions: int
    layers: int
    config: Any


def refusal(scheme: str, what: str, missing: str, nearest: str | None = None) -> PosEncError:
    tail = f"; nearest exportable setting: {nearest}" if nearest else ""
    return PosEncError(f"cannot export scheme {scheme!r} to GGUF: {what}: llama.cpp has {missing}{tail}. "
                       "Nothing was written; the folder runs with transformers + hf-posenc")


# schemes no llama.cpp graph computes -> what it lacks
REFUSED: dict[str, str] = {
    "learned": "no learned position table on a Llama-shaped architecture",
    "sinusoidal": "no sinusoidal position table on a Llama-shaped architecture",
    "concat": "no concatenated position code",
    "untied": "no TUPE position-position term",
    "t5": "no bucketed relative bias on a Llama-shaped architecture",
    "fire": "no learned functional bias (FIRE)",
    "kerple": "no learned functional bias (KERPLE)",
    "xpos": "no xPos decay of queries and keys",
    "cope": "no contextual positions (CoPE)",
    "pope": "no polar positions (PoPE)",
    "fope": "no Fourier positions (FoPE)",
    "hope": "no high-frequency-only rotation with its own layout (HoPE)",
    "self_extend": "no grouped positions in its GGUF keys (Self-Extend is a runtime option, --grp-attn-n)",
    "dynamic": "no dynamic NTK scaling type (types: none, linear, yarn, longrope)",
    "longrope": "LongRoPE's factors chosen by the context size at load, not per sequence as transformers does",
}
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}


def rotation(rotary: torch.nn.Module, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(angle per position, attention factor) of each of the head_dim/2 pairs (i, i + d/2), read from the rotary
    module the patch itself runs at position 1: a pair that does not rotate has angle 0."""
    cos, sin = rotary(torch.zeros(1), torch.tensor([[1]]))
    cos, sin = cos[0, 0, : head_dim // 2].double(), sin[0, 0, : head_dim // 2].double()
    return torch.atan2(sin, cos), torch.hypot(cos, sin)


def divisors(theta: float, inv: torch.Tensor, head_dim: int) -> tuple[float, ...] | None:
    """llama.cpp's `rope_freqs`: theta^(-2i/d) / rope_freqs[i] is pair i's frequency (inf: no rotation)."""
    base = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    factors = torch.where(inv > 0, base / inv.clamp_min(1e-300), torch.full_like(base, math.inf))
    return None if torch.allclose(factors, torch.ones_like(factors), rtol=1e-6, atol=0) else tuple(factors.tolist())


def rotary_target(label: str, params: dict[str, Any], partial: float, rotary: torch.nn.Module, facts: Facts) -> Target:
    """RoPE and its scalings on a rotating family: llama.cpp's native keys where the converter writes them
    (base, linear, yarn), else the base and `rope_freqs` read off the rotation itself; refused where an attention
    factor or a per-frequency divisor has no key in the family's graph."""
    theta = float(params.get("rope_theta", 10_000.0))
    rope_type = params.get("rope_type", "default")
    keys: dict[str, Any] = {"rope.freq_base": theta, "rope.dimension_count": facts.head_dim}
    if rope_type == "yarn":
        betas = {k: float(params.get(k) or v) for k, v in YARN_DEFAULTS.items()}
        if betas != YARN_DEFAULTS or partial != 1.0 or params.get("truncate", True) is not True:
            option = next((k for k in YARN_DEFAULTS if betas[k] != YARN_DEFAULTS[k]), None) or \
                ("partial" if partial != 1.0 else "truncate")
            value = partial if option == "partial" else params.get(option)
            raise refusal(label, f"option {option}={value}",
                          f"YaRN only with its default ramp (beta_fast 32, beta_slow 1) on every dimension of the "
                          f"{facts.family.arch!r} graph (the rope.scaling.yarn_beta_* keys are not read there)",
                          "yarn with beta_fast=32, beta_slow=1, partial=1")
        factor = float(params["factor"])
        keys.update({"rope.scaling.type": "yarn", "rope.scaling.factor": factor,
                     "rope.scaling.original_context_length": int(params["original_max_position_embeddings"])})
        scale = float(rotation(rotary, facts.head_dim)[1][0])
        default = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        if not math.isclose(scale, default, rel_tol=1e-6):  # ggml multiplies attn_factor by YaRN's 0.1 ln s + 1
            keys["rope.scaling.attn_factor"] = scale / default
        return Target(facts.family.arch, keys, None, f"{label}: YaRN x{factor:g} (rope.scaling.type yarn)")
    if rope_type == "linear" and partial == 1.0:
        keys.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(params["factor"])})
        return Target(facts.family.arch, keys, None, f"{label}: linear x{float(params['factor']):g}")
    inv, scale = rotation(rotary, facts.head_dim)
    if not torch.allclose(scale, torch.ones_like(scale), rtol=1e-6):
        raise refusal(label, f"rope type {rope_type!r} with attention factor {float(scale[0]):g}",
                      "an attention factor only with rope.scaling.type yarn")
    freqs = divisors(theta, inv, facts.head_dim)
    if freqs is not None and facts.family.arch != "llama":
        raise refusal(label, f"rope type {rope_type!r}" + (f", partial {partial:g}" if partial != 1 else "") +
                      " (frequencies of its own)", f"no rope_freqs tensor in the {facts.family.arch!r} graph",
                      "rope or yarn with partial=1")
    how = "theta " + f"{theta:g}" + (" and rope_freqs (per-frequency divisors)" if freqs else "")
    return Target(facts.family.arch, keys, freqs, f"{label}: {how}")


def rope_entry(scheme: str, options: dict[str, Any], facts: Facts) -> Target:
    """A rotary scheme: its `rope_parameters` for the native keys, its own rotary module for the frequencies."""
    spec = get_scheme(scheme)
    model_facts = ModelFacts(hidden_size=facts.config.hidden_size, num_heads=facts.config.num_attention_heads,
                             head_dim=facts.head_dim, max_positions=facts.max_positions, causal=True,
                             rope_parameters=None, position_table=None)
    return rotary_target(scheme, spec.rope_parameters(options, model_facts), float(options.get("partial") or 1.0),
                         spec.rotary(options, model_facts, facts.max_positions), facts)


def alibi_entry(scheme: str, options: dict[str, Any], facts: Facts) -> Target:
    """ALiBi: `refact` (llama.cpp's only Llama-shaped ALiBi graph) with its hard-coded max bias 8."""
    if facts.family.qkv_bias or getattr(facts.config, "attention_bias", False) or getattr(facts.config, "mlp_bias", False):
        raise refusal(scheme, f"{facts.stock} with biases", "ALiBi on a Llama shape only in 'refact', which has no biases")
    for option, wanted in (("max_bias", 8.0), ("scale", 1.0)):
        if float(options.get(option) or 1.0) != wanted:
            raise refusal(scheme, f"option {option}={options[option]}",
                          f"ALiBi on a Llama shape only in 'refact', whose {option} is {wanted:g} (hard-coded)",
                          f"alibi with {option}={wanted:g}")
    return Target("refact", {}, None, "alibi: ALiBi slopes 2^(-8h/H) (refact)")


def nope_entry(scheme: str, options: dict[str, Any], facts: Facts) -> Target:
    """Whole-model NoPE: `granite` with its rotation switched off (rope.scaling.finetuned = false)."""
    if facts.family.qkv_bias:
        raise refusal(scheme, f"{facts.stock} (q/k/v biases)", "NoPE only in 'granite', which has no q/k/v biases")
    return Target("granite", {"rope.scaling.finetuned": False, "logit_scale": 1.0, "embedding_scale": 1.0,
                              "residual_scale": 1.0, "attention.scale": 1.0 / math.sqrt(facts.head_dim)},
                  None, "nope: no positions in any layer (granite, rope off)")


TARGETS: dict[str, Callable[[str, dict[str, Any], Facts], Target]] = {
    **{name: rope_entry for name in ("rope", "ntk", "linear", "yarn", "llama3", "p_rope")},
    "alibi": alibi_entry,
    "nope": nope_entry,
}


def smollm3_layers(entries: list[dict[str, Any]], facts: Facts) -> Target | None:
    """A per-layer NoPE in exactly every 4th layer (3, 7, ...) over the stock rotation: llama.cpp's `smollm3`."""
    every4 = [i for i in range(facts.layers) if (i + 1) % 4 == 0]
    if len(entries) != 1 or TARGETS[entries[0]["scheme"]] is not nope_entry or list(entries[0]["layers"]) != every4 \
            or not every4:
        return None
    stock = stock_target(facts)
    if stock.arch != "llama" or stock.rope_freqs is not None:
        return None
    return Target("smollm3", stock.keys, None, f"nope in layers {every4} (smollm3), the model's own RoPE elsewhere")


def stock_target(facts: Facts) -> Target:
    """An unpatched model: its own rope_parameters, as llama.cpp's converter writes them."""
    params = dict(getattr(facts.config, "rope_parameters", None) or {})
    params.setdefault("rope_theta", getattr(facts.config, "rope_theta", 10_000.0))
    partial = float(params.get("partial_rotary_factor") or getattr(facts.config, "partial_rotary_factor", 1.0) or 1.0)
    rotary = Rotary(facts.head_dim, params, partial, facts.max_positions)
    return rotary_target(f"{params.get('rope_type', 'default')} (the model's own)", params, partial, rotary, facts)


def facts_of(config: Any, stock: str | None = None) -> Facts:
    """The config's facts; `stock` names the class of an in-memory model whose config has no `architectures`."""
    stock = (stock_architectures(config) or [stock or "?"])[0]
    family = FAMILIES.get(stock)
    if family is None:
        raise PosEncError(f"cannot export {stock} to GGUF: hf-posenc writes GGUF for {', '.join(FAMILIES)}; "
                          "nothing was written")
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    if window is not None and window < config.max_position_embeddings:
        raise PosEncError(f"cannot export {stock} with sliding_window={window} to GGUF: llama.cpp's "
                          f"{family.arch!r} graph attends to the whole context; nothing was written")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Facts(family, stock, head_dim, config.max_position_embeddings, config.num_hidden_layers, config)


def target_of(config: Any, stock: str | None = None) -> Target:
    """The positions of a (patched) model's config as one llama.cpp architecture and its keys, or PosEncError
    naming the scheme, the option and what llama.cpp lacks, before anything is read or written."""
    facts = facts_of(config, stock)
    posenc = getattr(config, "posenc", None)
    if not posenc:
        return stock_target(facts)
    entries = posenc["map"] if "map" in posenc else [posenc]
    for entry in entries:
        if entry["scheme"] in REFUSED:
            raise refusal(entry["scheme"], f"scheme {entry['scheme']!r}", REFUSED[entry["scheme"]])
        if entry["scheme"] not in TARGETS:
            raise refusal(entry["scheme"], f"scheme {entry['scheme']!r}", "no graph known to compute it")
    if any(entry.get("layers") is not None for entry in entries):
        target = smollm3_layers(entries, facts)
        if target is None:
            names = ", ".join(f"{e['scheme']} in layers {e.get('layers')}" for e in entries)
            raise refusal(entries[0]["scheme"], f"a per-layer patch ({names})",
                          "one position scheme for all layers, except NoPE in exactly every 4th layer (smollm3)",
                          "the same scheme in every layer")
        return target
    entry = entries[0]
    return TARGETS[entry["scheme"]](entry["scheme"], dict(entry.get("options") or {}), facts)
