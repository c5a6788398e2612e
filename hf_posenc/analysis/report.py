"""`inspect_model`: every analysis that applies to a model, written as inspect.json and PNG plots."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .. import plots
from ..patching import describe
from ..schemes.sinusoidal import sinusoidal_code
from .logit_terms import BIAS_TERMS, TERMS, distance_slopes, four_terms, rotary_cos, rotary_profile
from .encoding import energy_by_direction, format_encoding, shift_fit
from .geometry import encoding_by_distance, exact, format_geometry, principal_basis, subspace_geometry
from .positions import check_length, max_positions, position_kind, position_vectors, token_vectors


def inspect_model(
    model: nn.Module,
    input_ids: Tensor,
    out_dir: str | Path,
    name: str = "model",
    top_k: int | None = None,
    pos_dim: int | None = None,
    seeds: int = 5,
    max_distance: int = 256,
) -> dict[str, Any]:
    """Run every analysis that applies to `model` and write `inspect.json` and PNG plots to `out_dir`.

    Args:
        input_ids: the tokenized text (one sequence) used for the attention analyses.
        top_k, pos_dim: token / position subspace dimensions (None: 90% of the energy).
        seeds: random subspaces for the baseline.
        max_distance: longest relative distance in the RoPE profile (capped at the model's limit).
    Returns the JSON content; its "summary" is what the CLI prints.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    input_ids = input_ids.reshape(1, -1)
    check_length(model, input_ids.shape[1])
    kind = position_kind(model)
    patched = describe(model)
    result: dict[str, Any] = {
        "model": name, "model_type": model.config.model_type, "positions": kind,
        "patched": patched.to_dict() if patched else None, "num_tokens": input_ids.shape[1], "plots": [],
    }
    if kind == "absolute":
        positions = position_vectors(model)
        tokens = token_vectors(model)
        geo = subspace_geometry(tokens, positions, top_k, pos_dim, seeds)
        terms = four_terms(model, input_ids).summary()
        by_distance = encoding_by_distance(positions)
        fit = shift_fit(positions)
        energy = energy_by_direction(positions, tokens)
        # the same questions asked of the sinusoidal code of this shape, against the same token embedding
        reference = energy_by_direction(sinusoidal_code(torch.arange(positions.shape[0]), positions.shape[1],
                                                        10_000.0), tokens)
        result.update(subspace=geo, four_terms=terms, encoding=by_distance, shift_fit=fit,
                      position_energy={"model": energy, "sinusoidal": reference},
                      summary=format_geometry(geo) + "\n" + format_encoding(fit, energy))
        plots.subspace(geo, out / "subspace.png", name)
        plots.four_terms(terms, TERMS, BIAS_TERMS, out / "four_terms.png", name)
        components = exact(positions) @ principal_basis(positions, k=min(32, *positions.shape))
        plots.encoding(positions, components, by_distance, out / "encoding.png", f"{name}: the positions it adds")
        plots.shift_fit(fit, out / "shift_fit.png", name)
        plots.position_energy(energy, reference, out / "position_energy.png", name)
        result["plots"] += ["subspace.png", "four_terms.png", "encoding.png", "shift_fit.png", "position_energy.png"]
    elif kind == "rotary":
        distance = min(max_distance, max_positions(model))
        profile = rotary_profile(model, input_ids, distance)
        result.update(rotary=profile, summary=(
            f"{name} has no position embedding table: positions rotate queries and keys (RoPE, "
            f"{profile['rotary_dim']} of {profile['head_dim']} head dims), so there is no position subspace "
            f"to compare with the token subspace and no four-term split; rotary.png shows the rotation and "
            f"the layer-0 and last-layer logit as a function of distance"))
        plots.rotary(profile, rotary_cos(model, distance), out / "rotary.png", name)
        result["plots"].append("rotary.png")
    elif kind == "per-layer":
        result["summary"] = (f"{name} has a per-layer patch ({patched!r}): its layers position differently, so no "
                             f"one view of positions describes the model; inspect each scheme on its own patch")
    elif (slopes := distance_slopes(model)) is not None:
        result.update(alibi_slopes=slopes, summary=(
            f"{name} adds no position vectors: ALiBi biases each head's scores by -slope * distance; "
            f"slopes {', '.join(f'{s:.4g}' for s in slopes)}; alibi.png shows the bias by distance"))
        plots.alibi_bias(slopes, min(max_distance, max_positions(model)), out / "alibi.png", name)
        result["plots"].append("alibi.png")
    elif kind == "none":
        result["summary"] = (f"{name} has no positional encoding (NoPE): position information can only come from "
                             f"the causal mask, so there is nothing to decompose or plot")
    else:
        result["summary"] = (f"{name} is patched to {kind!r}, a score-site scheme: positions enter as a bias on "
                             f"the attention scores, not as vectors, so neither subspace nor four-term analysis applies")
    (out / "inspect.json").write_text(_to_json(result))
    return result


def _to_json(result: dict[str, Any]) -> str:
    """Indented JSON with number lists kept on one line each."""
    text = json.dumps(_rounded(result), indent=1)
    return re.sub(r"\[\s+([-+\d.eE,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)


def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits, so a 30-layer RoPE profile stays a readable file."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def added_positions(model: nn.Module, input_ids: Tensor, length: int) -> dict[str, Any]:
    """The seed's question on a model that adds position vectors, in numbers a table can hold: the energy share
    and median principal angle of its first `length` position vectors in the token subspace (beside random
    subspaces of the same size), and layer 0's four attention terms (softmax-relevant shares, mean over heads) on
    `input_ids` (one sequence)."""
    geo = subspace_geometry(token_vectors(model), position_vectors(model, length))
    terms = four_terms(model, input_ids[None, :length] if input_ids.ndim == 1 else input_ids).summary()["softmax_share"]
    return {"position_energy_in_token_subspace": geo["position_energy_in_token_subspace"],
            "random_energy": geo["random"]["position_energy_in_token_subspace"]["mean"],
            "angles_median_deg": geo["angles"]["median"],
            "random_angles_median_deg": geo["random"]["angles"]["median"]["mean"],
            "four_terms": {term: sum(terms[term]) / len(terms[term]) for term in TERMS}}
