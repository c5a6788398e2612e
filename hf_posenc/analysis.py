"""Look at positions inside a model: subspace geometry, the four attention terms, the encoding itself.

The question behind it: positions are *added* to word embeddings, not concatenated. If the word
subspace and the position subspace are nearly orthogonal, adding costs little (it is concatenation in
a rotated basis); if attention mostly uses the content-content term, positions are cheap passengers.
This module measures both on a real model; `hf-posenc inspect MODEL --out DIR` writes JSON + PNG.

Run `hf-posenc inspect --help` for examples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .adapters.base import get_module
from .errors import PosEncError
from .models import NAMED_MODELS, display_name, model_source
from .patching import ROTARY_MODULE, describe, from_pretrained
from .registry import ADAPTERS, adapter_for, get_scheme
from .schemes import alibi as alibi_scheme

DEFAULT_TEXT = (
    "Positional encodings tell a transformer where each word stands. The original model added a fixed "
    "sinusoidal code to the word embeddings; later models learned a table of position vectors, and newer "
    "ones rotate queries and keys instead, so that attention depends on how far apart two words are."
)
ENERGY = 0.9  # default subspace rank: fewest principal directions that hold 90% of the energy
TERMS = ("content-content", "content-position", "position-content", "position-position")
BIAS_TERMS = ("content-bias", "position-bias", "bias-content", "bias-position", "bias-bias")


# --------------------------------------------------------------------------- where positions enter


def position_kind(model: nn.Module) -> str:
    """'absolute' (a vector is added to each token), 'rotary', 'none', or the name of a score-site scheme.

    Read from the patch in place (`describe`) or, for an unpatched model, from its adapter.
    """
    adapter, patched = adapter_for(model), describe(model)
    if patched is not None:
        site = get_scheme(patched.scheme).site
        return {"input": "absolute", "qk": "rotary", "none": "none"}.get(site, patched.scheme)
    return "absolute" if adapter.position_slot else "rotary" if adapter.rotary else "none"


def _kinds_allowed(kind: str) -> str:
    """Architectures whose unpatched positions are of this kind, for error messages."""
    adapters = {a.name: a for a in ADAPTERS.values()}
    have = {"absolute": lambda a: a.position_slot, "rotary": lambda a: a.rotary}[kind]
    return ", ".join(sorted(name for name, a in adapters.items() if have(a)))


def max_positions(model: nn.Module) -> int:
    return adapter_for(model).facts(model).max_positions


def check_length(model: nn.Module, length: int) -> None:
    """A text past the position table (or the trained context) is an error, not a silent wrap-around."""
    limit = max_positions(model)
    if length > limit:
        raise PosEncError(
            f"the text is {length} tokens but {model.config.model_type} allows at most {limit} positions; "
            f"shorten --text to {limit} tokens or fewer"
        )


def _qk_modules(model: nn.Module, layer: int) -> tuple[nn.Module, nn.Module | None]:
    """The modules whose outputs are layer `layer`'s q and k before any rotation (the adapter's q/k
    taps: after Qwen3's per-head norms); k is None when q, k, v leave one packed projection."""
    adapter = adapter_for(model)
    attention = adapter.attention_modules(model)[layer]
    names = adapter.qk.projections
    if adapter.qk.packed:
        return get_module(attention, names[0]), None
    return get_module(attention, names[0]), get_module(attention, names[1])


def _heads(model: nn.Module) -> tuple[int, int]:
    """(number of query heads, head dim)."""
    facts = adapter_for(model).facts(model)
    return facts.num_heads, facts.head_dim


class _Stop(Exception):
    """Raised from a hook to end a forward pass once the tensors needed are captured."""


def _run(model: nn.Module, input_ids: Tensor) -> None:
    try:
        model.base_model(input_ids=input_ids)
    except _Stop:
        pass


def _dummy_ids(model: nn.Module, length: int) -> Tensor:
    # any id that is not padding: RoBERTa numbers positions only for non-padding tokens
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    return torch.full((1, length), (pad + 1) % model.config.vocab_size, dtype=torch.long, device=_device(model))


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# --------------------------------------------------------------------------- subspace geometry


def token_vectors(model: nn.Module) -> Tensor:
    """The input (word) embedding matrix, (vocab, d), fp32."""
    return model.get_input_embeddings().weight.detach().float()


@torch.no_grad()
def position_vectors(model: nn.Module, length: int | None = None) -> Tensor:
    """The vectors the model adds at positions 0..length-1, (length, d), fp32.

    Read from the output of the model's own position module during a forward pass, so table
    offsets (RoBERTa, OPT) and patched input-site codes (sinusoidal) are what the model really uses.
    """
    kind = position_kind(model)
    if kind != "absolute":
        raise PosEncError(
            f"{model.config.model_type} has no position vectors added to its token embeddings (positions: "
            f"{kind}); allowed: {_kinds_allowed('absolute')}, or any model patched to an input-site scheme"
        )
    length = max_positions(model) if length is None else length
    check_length(model, length)
    captured: list[Tensor] = []

    def hook(module: nn.Module, args: Any, output: Tensor) -> None:
        captured.append(output.detach().float().reshape(-1, length, output.shape[-1])[0])
        raise _Stop

    handle = get_module(model.base_model, adapter_for(model).position_slot).register_forward_hook(hook)
    try:
        _run(model, _dummy_ids(model, length))
    finally:
        handle.remove()
    return captured[0]


def principal_basis(vectors: Tensor, k: int | None = None, energy: float = ENERGY) -> Tensor:
    """Orthonormal basis (d, k) of the top-k principal directions of the rows of `vectors`.

    Uncentred (right singular vectors), because what the model adds is the vectors themselves,
    mean included. `k=None`: the fewest directions that hold `energy` of the squared norm.
    """
    _, s, vh = torch.linalg.svd(vectors.double(), full_matrices=False)
    if k is None:
        share = (s**2).cumsum(0) / (s**2).sum()
        k = int((share < energy).sum()) + 1
    if not 0 < k <= vh.shape[0]:
        raise PosEncError(f"subspace dimension must be in 1..{vh.shape[0]} (rank of the vectors), got {k}")
    return vh[:k].T


def principal_angles(a: Tensor, b: Tensor) -> Tensor:
    """Principal angles in degrees, ascending, between span(a) and span(b); a (d, p), b (d, q) orthonormal.

    cos(theta_i) are the singular values of a^T b (Bjorck & Golub 1973). Computed in fp64; the cosines
    are clamped to [0, 1] against rounding.
    """
    cos = torch.linalg.svdvals(a.double().T @ b.double()).clamp(0.0, 1.0)
    return torch.rad2deg(torch.arccos(cos)).sort().values


def energy_share(vectors: Tensor, basis: Tensor) -> float:
    """Share of the rows' squared norm that lies in span(basis): ||V B||^2 / ||V||^2."""
    v = vectors.double()
    return float((v @ basis.double()).pow(2).sum() / v.pow(2).sum())


def random_basis(d: int, k: int, seed: int) -> Tensor:
    """A uniformly (Haar) distributed k-dim subspace of R^d: QR of a Gaussian matrix."""
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64)).Q


def _angle_stats(angles: Tensor) -> dict[str, float]:
    return {"min": float(angles.min()), "median": float(angles.median()), "mean": float(angles.mean()),
            "max": float(angles.max())}


def subspace_geometry(
    tokens: Tensor, positions: Tensor, top_k: int | None = None, pos_dim: int | None = None, seeds: int = 5
) -> dict[str, Any]:
    """Are the token subspace and the position subspace nearly orthogonal, compared with chance?

    Args:
        tokens: token embedding matrix (vocab, d); its top-`top_k` principal subspace is compared.
        positions: the position vectors actually added (L, d); their top-`pos_dim` principal subspace.
        top_k, pos_dim: subspace dimensions; None = the fewest holding 90% of the energy.
        seeds: random `top_k`-dim subspaces drawn as the baseline (mean and std reported).
    """
    d = tokens.shape[1]
    if positions.shape[1] != d:
        raise PosEncError(f"token vectors have width {d} but position vectors {positions.shape[1]}")
    if seeds < 2:
        raise PosEncError(f"the random baseline needs at least 2 seeds for a std, got {seeds}")
    tok, pos = principal_basis(tokens, top_k), principal_basis(positions, pos_dim)
    angles = principal_angles(tok, pos)
    randoms = [random_basis(d, tok.shape[1], seed) for seed in range(seeds)]
    rand_angles = torch.stack([principal_angles(r, pos) for r in randoms])
    rand_energy = torch.tensor([energy_share(positions, r) for r in randoms])
    rand_stats = [_angle_stats(a) for a in rand_angles]
    return {
        "d": d,
        "top_k": tok.shape[1],
        "pos_dim": pos.shape[1],
        "num_positions": positions.shape[0],
        "token_energy_in_top_k": energy_share(tokens, tok),
        "position_energy_in_pos_dim": energy_share(positions, pos),
        "angles_deg": angles.tolist(),
        "angles": _angle_stats(angles),
        "position_energy_in_token_subspace": energy_share(positions, tok),
        "random": {
            "seeds": seeds,
            "angles_deg_mean": rand_angles.mean(0).tolist(),
            "angles_deg_std": rand_angles.std(0).tolist(),
            "angles": {key: {"mean": float(torch.tensor([s[key] for s in rand_stats]).mean()),
                             "std": float(torch.tensor([s[key] for s in rand_stats]).std())}
                       for key in rand_stats[0]},
            "position_energy_in_token_subspace": {"mean": float(rand_energy.mean()), "std": float(rand_energy.std()),
                                                  "expected": tok.shape[1] / d},
        },
    }


def format_geometry(geo: dict[str, Any]) -> str:
    a, r = geo["angles"], geo["random"]
    ra, re = r["angles"], r["position_energy_in_token_subspace"]
    return "\n".join([
        (f"token subspace: top {geo['top_k']} of d={geo['d']} principal directions "
        f"({geo['token_energy_in_top_k']:.0%} of token energy); position subspace: top {geo['pos_dim']} "
        f"({geo['position_energy_in_pos_dim']:.0%} of the energy of positions 0..{geo['num_positions'] - 1})"),
        (f"principal angles (deg)  min {a['min']:5.1f}  median {a['median']:5.1f}  mean {a['mean']:5.1f}  "
        f"max {a['max']:5.1f}"),
        (f"random {geo['top_k']}-dim (n={r['seeds']})  min {ra['min']['mean']:5.1f}  median {ra['median']['mean']:5.1f}"
        f"  mean {ra['mean']['mean']:5.1f}  max {ra['max']['mean']:5.1f}  (std of mean {ra['mean']['std']:.2f})"),
        (f"position energy in token subspace: {geo['position_energy_in_token_subspace']:.3f}  "
        f"random: {re['mean']:.3f} +- {re['std']:.3f} (expected k/d = {re['expected']:.3f})"),
    ])


# --------------------------------------------------------------------------- four-term decomposition


@dataclasses.dataclass
class FourTerms:
    """Layer-0 pre-softmax logits split by source, each (heads, T, T), already times the 1/sqrt(d_h) scale.

    `terms` holds the four terms of Ke et al. (2021, TUPE, eq. 4) plus the five that involve the
    "bias" part (LayerNorm shift and projection biases, the same for every token). Their sum is the
    model's own layer-0 logit q.k / sqrt(d_h). `valid` marks the (query, key) pairs attention uses.
    """

    terms: dict[str, Tensor]
    valid: Tensor

    def total(self) -> Tensor:
        return sum(self.terms.values())

    def summary(self) -> dict[str, Any]:
        """Per head: mean |term| over valid pairs and its share of the summed magnitudes.

        `softmax_share` does the same after subtracting each term's mean over the keys of a query:
        softmax ignores what is constant along keys, so terms with the key-side bias (content-bias,
        position-bias, bias-bias) vanish there, and the rest show what attention actually uses.
        """
        valid = self.valid.to(next(iter(self.terms.values())).dtype)

        def shares(terms: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
            mags = {name: t.abs()[:, self.valid].mean(-1) for name, t in terms.items()}
            total = sum(mags.values())
            return mags, {name: m / total for name, m in mags.items()}

        centred = {name: t - ((t * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True))
                   for name, t in self.terms.items()}
        mags, share = shares(self.terms)
        _, softmax_share = shares(centred)
        return {
            "layer": 0,
            "pairs": int(self.valid.sum()),
            "mean_abs": {name: m.tolist() for name, m in mags.items()},
            "share": {name: m.tolist() for name, m in share.items()},
            "softmax_share": {name: m.tolist() for name, m in softmax_share.items()},
        }


def _project(model: nn.Module, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """Layer-0 q and k, (T, heads, d_h), from the model's own projection modules."""
    heads, head_dim = _heads(model)
    q_proj, k_proj = _qk_modules(model, 0)
    q = q_proj(hidden)
    if k_proj is None:  # packed [q | k | v]
        q, k = q[..., : heads * head_dim], q[..., heads * head_dim: 2 * heads * head_dim]
    else:
        k = k_proj(hidden)
    return q.reshape(-1, heads, head_dim), k.reshape(-1, heads, head_dim)


@torch.no_grad()
def four_terms(model: nn.Module, input_ids: Tensor) -> FourTerms:
    """Split layer 0's attention logits into content/position/bias terms (one text, no padding).

    With x the content vector (word, plus BERT's token-type vector, which is the same at every
    position), e the position vector and s = x + e the LayerNorm input, LayerNorm is linear in s once
    the per-token scale sigma(s) is fixed at its actual value: LN(s) = g*(x - mean x)/sigma +
    g*(e - mean e)/sigma + beta. q/k projections are linear plus a bias, so the logit splits exactly
    (Ke et al. 2021, eq. 4) into the four terms and five bias terms (beta and projection biases). Only layer 0 is decomposed: deeper inputs have passed attention and MLPs, which
    mix token and position information non-linearly, and no split of them is exact.
    """
    kind = position_kind(model)
    if kind != "absolute":
        raise PosEncError(
            f"the four-term decomposition needs positions added to the token embeddings, but "
            f"{model.config.model_type} has positions: {kind}; allowed: {_kinds_allowed('absolute')} "
            f"(learned or an input-site scheme such as sinusoidal). For RoPE models use rotary_profile(), "
            f"for ALiBi alibi_slopes()"
        )
    input_ids = input_ids.reshape(1, -1).to(_device(model))
    length = input_ids.shape[1]
    check_length(model, length)
    seen: dict[Any, Tensor] = {}

    def keep(key: Any) -> Callable:
        def hook(module: nn.Module, args: Any, output: Tensor) -> None:
            seen[key] = output.detach().float().reshape(-1, length, output.shape[-1])[0]
            if isinstance(module, nn.LayerNorm):
                seen[key, "in"] = args[0].detach().float()[0]
        return hook

    def stop(module: nn.Module, args: Any) -> None:
        seen["q_in"] = args[0].detach().float()[0]
        raise _Stop

    # the LayerNorm feeding layer 0's q/k is found by value (BERT: embeddings.LayerNorm, GPT-2: h.0.ln_1)
    norms = [m for m in model.base_model.modules() if isinstance(m, nn.LayerNorm)]
    q_proj = _qk_modules(model, 0)[0]
    handles = [model.get_input_embeddings().register_forward_hook(keep("word")),
               get_module(model.base_model, adapter_for(model).position_slot).register_forward_hook(keep("position")),
               q_proj.register_forward_pre_hook(stop),
               *(m.register_forward_hook(keep(m)) for m in norms)]
    try:
        _run(model, input_ids)
    finally:
        for h in handles:
            h.remove()
    norm = next((m for m in reversed(norms) if m in seen and torch.equal(seen[m], seen["q_in"])), None)
    if norm is None:
        raise PosEncError(
            f"no LayerNorm feeds layer 0's queries and keys directly in {model.config.model_type}; the four-term "
            f"decomposition needs word + position -> LayerNorm -> q/k (allowed: {_kinds_allowed('absolute')})"
        )
    seen["norm_in"] = seen[norm, "in"]
    x, e, s = seen["word"], seen["position"], seen["norm_in"]
    rest = s - x - e
    if (rest - rest[:1]).abs().max() > 1e-4 * (1 + s.abs().max()):
        raise PosEncError(
            f"positions do not enter {model.config.model_type} additively (the LayerNorm input before layer 0 "
            f"is not word + position + a constant); the four-term decomposition needs added positions"
        )
    sigma = torch.sqrt(s.var(-1, unbiased=False, keepdim=True) + norm.eps)
    gamma = norm.weight.float() if norm.weight is not None else torch.ones_like(s[0])
    beta = norm.bias.float() if norm.bias is not None else torch.zeros_like(s[0])

    def part(v: Tensor) -> Tensor:
        return gamma * (v - v.mean(-1, keepdim=True)) / sigma

    dtype = next(q_proj.parameters()).dtype
    zero_q, zero_k = _project(model, torch.zeros_like(s[:1]).to(dtype))
    parts: dict[str, tuple[Tensor, Tensor]] = {}
    for name, vec in (("content", part(x + rest)), ("position", part(e)), ("bias", beta[None].expand_as(s))):
        q, k = _project(model, vec.to(dtype))
        if name != "bias":  # the projection bias belongs to the bias part only
            q, k = q - zero_q, k - zero_k
        parts[name] = (q.float().transpose(0, 1), k.float().transpose(0, 1))  # (heads, T, d_h)

    scale = _heads(model)[1] ** -0.5
    terms = {f"{a}-{b}": scale * parts[a][0] @ parts[b][1].transpose(-1, -2)
             for a in ("content", "position", "bias") for b in ("content", "position", "bias")}
    terms = {name: terms[name] for name in TERMS + BIAS_TERMS}
    valid = torch.ones(length, length, dtype=torch.bool, device=x.device)
    if adapter_for(model).causal:
        valid = valid.tril()
    return FourTerms(terms=terms, valid=valid)


# --------------------------------------------------------------------------- what replaces the terms


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on the first cos.shape[-1] dims, rotate-half layout (Su et al. 2021, eq. 34); the rest pass."""
    rot = cos.shape[-1]
    x1, x2 = x[..., :rot].chunk(2, dim=-1)
    rotated = x[..., :rot] * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((rotated, x[..., rot:].expand(*rotated.shape[:-1], -1)), dim=-1)


@torch.no_grad()
def rotary_profile(model: nn.Module, input_ids: Tensor, max_distance: int = 256) -> dict[str, Any]:
    """What RoPE puts where the position terms were: the logit as a function of relative distance.

    For each layer and head, curve[delta] = mean over token pairs (t, s) of q_t^T R(delta) k_s /
    sqrt(d_h) = qbar^T R(delta) kbar / sqrt(d_h) (bilinear, so the mean over pairs is the logit of the
    mean query and key): the content-independent preference for keys `delta` tokens back. q and k are
    read from the model's own projections on the text, R from the model's own rotary module. The
    reference curve uses q = k = ones, RoFormer's long-term decay (Su et al. 2021, sec. 3.4.3).
    """
    if position_kind(model) != "rotary":
        raise PosEncError(f"{model.config.model_type} does not rotate queries and keys (positions: "
                          f"{position_kind(model)}); allowed: {_kinds_allowed('rotary')} or a model patched to RoPE")
    input_ids = input_ids.reshape(1, -1).to(_device(model))
    check_length(model, input_ids.shape[1])
    heads, head_dim = _heads(model)
    seen: dict[tuple[str, int], Tensor] = {}

    def keep(layer: int, which: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Tensor) -> None:
            out = output.detach().float().reshape(input_ids.shape[1], -1, head_dim)
            if which == "qkv":  # packed [q | k | v]
                seen["q", layer], seen["k", layer] = out[:, :heads], out[:, heads: 2 * heads]
            else:
                seen[which, layer] = out
        return hook

    layers = len(adapter_for(model).attention_modules(model))
    handles = []
    for i in range(layers):
        q_proj, k_proj = _qk_modules(model, i)
        # prepend: run before a patch's own hook rotates the projection output in place of the model
        handles.append(q_proj.register_forward_hook(keep(i, "q" if k_proj else "qkv"), prepend=True))
        if k_proj is not None:
            handles.append(k_proj.register_forward_hook(keep(i, "k"), prepend=True))
    try:
        model.base_model(input_ids=input_ids)
    finally:
        for h in handles:
            h.remove()
    distances = torch.arange(max_distance, device=_device(model))
    cos, sin = _rotary_module(model)(torch.zeros(1, device=distances.device), distances[None])
    cos, sin = cos[0].float(), sin[0].float()  # (D, rot_dim)
    scale = head_dim**-0.5
    curves = []
    for i in range(layers):
        q, k = seen[("q", i)].mean(0), seen[("k", i)].mean(0)  # (heads, d_h), (kv heads, d_h)
        k = k.repeat_interleave(heads // k.shape[0], dim=0)
        # query at position delta, key at position 0: R_0 only applies the rotary scaling factor
        q_rot = _rotate(q[None], cos[:, None], sin[:, None])  # (D, heads, d_h)
        k_rot = _rotate(k, cos[:1], sin[:1])
        curves.append(scale * (q_rot * k_rot).sum(-1).T)  # (heads, D)
    ones = torch.ones(1, head_dim, device=cos.device)
    reference = scale * (_rotate(ones, cos, sin) * _rotate(ones, cos[:1], sin[:1])).sum(-1)
    return {"distances": distances.tolist(), "layers": [c.tolist() for c in torch.stack(curves).cpu()],
            "reference_ones": reference.cpu().tolist(), "head_dim": head_dim,
            "rotary_dim": int((sin.abs().amax(0) > 0).sum())}  # a partial patch pads cos=1, sin=0


def _rotary_module(model: nn.Module) -> nn.Module:
    """The module returning (cos, sin): the model's own (possibly rebuilt by a patch) or the patch's."""
    rotary = adapter_for(model).rotary
    return get_module(model.base_model, rotary or ROTARY_MODULE)


def alibi_slopes(model: nn.Module) -> list[float]:
    """ALiBi's per-head slopes m_h: the score bias is -m_h * distance (Press et al. 2022)."""
    patched = describe(model)
    if patched is None or patched.scheme != "alibi":
        raise PosEncError(f"{model.config.model_type} has no ALiBi bias (positions: {position_kind(model)}); "
                          f"allowed: a model patched with hf_posenc.patch(model, 'alibi')")
    return alibi_scheme.alibi_slopes(_heads(model)[0], patched.options["max_bias"]).tolist()


# --------------------------------------------------------------------------- the encoding itself


def encoding_by_distance(positions: Tensor) -> dict[str, list[float]]:
    """Mean dot product and cosine of position i with position i + delta, for each distance delta."""
    p = positions.double()
    dots = p @ p.T
    norms = p.norm(dim=-1)
    cosines = dots / (norms[:, None] * norms[None, :]).clamp_min(1e-12)
    n = p.shape[0]
    return {"distance": list(range(n)),
            "dot": [float(dots.diagonal(delta).mean()) for delta in range(n)],
            "cosine": [float(cosines.diagonal(delta).mean()) for delta in range(n)]}


@torch.no_grad()
def rotary_cos(model: nn.Module, length: int) -> Tensor:
    """cos(m * theta_j) for positions m < length and each rotary frequency j, (length, rot_dim / 2)."""
    positions = torch.arange(length, device=_device(model))[None]
    cos, _ = _rotary_module(model)(torch.zeros(1, device=positions.device), positions)
    return cos[0, :, : cos.shape[-1] // 2].float().cpu()


# --------------------------------------------------------------------------- plots


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_subspace(geo: dict[str, Any], path: Path, title: str) -> None:
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2.2, 1]})
    idx = range(1, len(geo["angles_deg"]) + 1)
    mean, std = torch.tensor(geo["random"]["angles_deg_mean"]), torch.tensor(geo["random"]["angles_deg_std"])
    ax.fill_between(idx, mean - std, mean + std, color="0.8", label=f"random {geo['top_k']}-dim subspaces (mean +- std)")
    ax.plot(idx, mean, color="0.5")
    ax.plot(idx, geo["angles_deg"], "o-", color="C3", label="token subspace")
    ax.set(xlabel=f"principal angle index (position subspace: top {geo['pos_dim']} directions)",
           ylabel="angle (degrees)", ylim=(0, 90), title="principal angles: position vs token subspace")
    ax.legend(loc="lower right")
    rand = geo["random"]["position_energy_in_token_subspace"]
    bx.bar([0, 1], [geo["position_energy_in_token_subspace"], rand["mean"]], yerr=[0, rand["std"]],
           color=["C3", "0.6"], tick_label=["token\nsubspace", "random\nsubspace"])
    bx.axhline(rand["expected"], ls="--", color="0.3", lw=1, label=f"k/d = {rand['expected']:.2f}")
    bx.set(ylim=(0, 1), title="position energy inside", ylabel="share of squared norm")
    bx.legend(loc="upper right")
    fig.suptitle(f"{title}: token top-{geo['top_k']} of d={geo['d']} vs positions 0..{geo['num_positions'] - 1}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_four_terms(summary: dict[str, Any], path: Path, title: str) -> None:
    plt = _pyplot()
    columns = [*TERMS, "bias terms (5)"]
    fig, axes = plt.subplots(1, 2, figsize=(2.4 * len(columns) + 2, 0.45 * len(summary["share"][TERMS[0]]) + 2.2))
    for ax, key, label in ((axes[0], "share", "share of mean |logit term|"),
                           (axes[1], "softmax_share", "same, each term centred over keys (what softmax sees)")):
        share = summary[key]
        bias = [sum(v) for v in zip(*(share[t] for t in BIAS_TERMS))]
        grid = torch.tensor([share[t] for t in TERMS] + [bias]).T
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for h in range(grid.shape[0]):
            for c in range(grid.shape[1]):
                v = float(grid[h, c])
                ax.text(c, h, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k", fontsize=8)
        ax.set_xticks(range(len(columns)), [c.replace("-", "-\n") for c in columns])
        ax.set_yticks(range(grid.shape[0]), [f"head {h}" for h in range(grid.shape[0])])
        ax.set_title(label, fontsize=10)
    fig.colorbar(im, ax=axes, fraction=0.03)
    fig.suptitle(f"{title}: layer-0 attention logit terms ({summary['pairs']} query-key pairs)")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_encoding(positions: Tensor, by_distance: dict[str, list[float]], path: Path, title: str) -> None:
    """Raw dimensions, then the same vectors in their own principal basis, where a learned table's
    smooth low-frequency structure shows up, then similarity by distance."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
    components = positions.double() @ principal_basis(positions, k=min(32, *positions.shape))
    for ax, data, xlabel, name in ((axes[0], positions, "dimension", "position vectors"),
                                   (axes[1], components, "principal direction (by energy)", "in their principal basis")):
        lim = float(data.abs().quantile(0.99))
        im = ax.imshow(data.cpu(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
        ax.set(xlabel=xlabel, ylabel="position", title=name)
        fig.colorbar(im, ax=ax)
    bx = axes[2]
    bx.plot(by_distance["distance"], by_distance["cosine"], color="C0", label="cosine")
    bx.set(xlabel="distance |i - j|", ylabel="mean cosine", title="position i vs position j")
    bx.axhline(0, color="0.7", lw=0.8)
    tx = bx.twinx()
    tx.plot(by_distance["distance"], by_distance["dot"], color="C1", alpha=0.7, label="dot product")
    tx.set_ylabel("mean dot product")
    bx.legend(handles=bx.get_lines()[:1] + tx.get_lines(), loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_alibi(slopes: list[float], max_distance: int, path: Path, title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    distance = torch.arange(max_distance)
    for h, slope in enumerate(slopes):
        ax.plot(distance, -slope * distance, lw=1, label=f"head {h}: m = {slope:.3g}")
    ax.set(xlabel="distance |query - key|", ylabel="bias added to the logit", title=f"{title}: ALiBi bias by distance")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rotary(profile: dict[str, Any], cos: Tensor, path: Path, title: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    im = axes[0].imshow(cos, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    axes[0].set(xlabel="frequency index j (fast -> slow)", ylabel="position m", title="cos(m theta_j): the rotation")
    fig.colorbar(im, ax=axes[0])
    d = profile["distances"]
    last = len(profile["layers"]) - 1
    for ax, layer in ((axes[1], 0), (axes[2], last)):
        for h, curve in enumerate(profile["layers"][layer]):
            ax.plot(d, curve, lw=1, label=f"head {h}")
        ax.set(xlabel="distance (query - key)", ylabel="mean logit  qbar R(d) kbar / sqrt(d_h)",
               title=f"layer {layer}: logit by distance, text q/k")
    ref = axes[1].twinx()
    ref.plot(d, profile["reference_ones"], "k--", lw=1)
    ref.set_ylabel("q = k = ones (RoFormer decay), dashed")
    axes[2].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- inspect


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
        geo = subspace_geometry(token_vectors(model), positions, top_k, pos_dim, seeds)
        terms = four_terms(model, input_ids).summary()
        by_distance = encoding_by_distance(positions)
        result.update(subspace=geo, four_terms=terms, encoding=by_distance, summary=format_geometry(geo))
        plot_subspace(geo, out / "subspace.png", name)
        plot_four_terms(terms, out / "four_terms.png", name)
        plot_encoding(positions, by_distance, out / "encoding.png", f"{name}: the positions it adds")
        result["plots"] += ["subspace.png", "four_terms.png", "encoding.png"]
    elif kind == "rotary":
        distance = min(max_distance, max_positions(model))
        profile = rotary_profile(model, input_ids, distance)
        result.update(rotary=profile, summary=(
            f"{name} has no position embedding table: positions rotate queries and keys (RoPE, "
            f"{profile['rotary_dim']} of {profile['head_dim']} head dims), so there is no position subspace "
            f"to compare with the token subspace and no four-term split; rotary.png shows the rotation and "
            f"the layer-0 and last-layer logit as a function of distance"))
        plot_rotary(profile, rotary_cos(model, distance), out / "rotary.png", name)
        result["plots"].append("rotary.png")
    elif kind == "alibi":
        slopes = alibi_slopes(model)
        result.update(alibi_slopes=slopes, summary=(
            f"{name} adds no position vectors: ALiBi biases each head's scores by -slope * distance; "
            f"slopes {', '.join(f'{s:.4g}' for s in slopes)}; alibi.png shows the bias by distance"))
        plot_alibi(slopes, min(max_distance, max_positions(model)), out / "alibi.png", name)
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


# --------------------------------------------------------------------------- CLI

def load(model: str) -> tuple[nn.Module, Any, str]:
    """(base model in eval mode, tokenizer, display name) for a named offline model or a local path."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    path, kwargs = model_source(model)
    name = display_name(model)
    if model not in NAMED_MODELS and not Path(path).is_dir():
        raise PosEncError(f"MODEL must be a local model folder or one of {', '.join(NAMED_MODELS)}; got {model!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as err:
        raise PosEncError(f"{model!r} has no tokenizer that loads offline; save one next to the model ({err})") from err
    # hf_posenc's loader re-applies a saved patch (plain from_pretrained would silently drop it); the
    # checkpoint's own class keeps its weight names, and every analysis uses `model.base_model`
    architectures = getattr(AutoConfig.from_pretrained(path, **kwargs), "architectures", None) or [""]
    cls = getattr(transformers, architectures[0], transformers.AutoModel)
    net = from_pretrained(str(path), model_cls=cls, dtype=torch.float32, **kwargs)
    return net.eval(), tokenizer, name


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    parser.epilog = (
        "examples:\n"
        "  hf-posenc inspect minilm --out runs/inspect_minilm\n"
        "  hf-posenc inspect smollm2 --out runs/inspect_smollm2 --text \"The cat sat on the mat.\"\n"
        "  hf-posenc inspect ./my-bert --out runs/inspect --top-k 128\n"
        f"named offline models: {'; '.join(f'{k} = {v[3]} ({v[4]})' for k, v in NAMED_MODELS.items())}"
    )
    parser.add_argument("model", metavar="MODEL", help=f"a local model folder, or {' / '.join(NAMED_MODELS)}")
    parser.add_argument("--out", required=True, help="output folder for inspect.json and the PNG plots")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="text for the attention analyses (default: a short paragraph)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="token subspace dimension (default: principal directions holding 90%% of the energy)")
    parser.add_argument("--pos-dim", type=int, default=None,
                        help="position subspace dimension (default: 90%% of the position energy)")
    parser.add_argument("--seeds", type=int, default=5, help="random subspaces for the baseline (default 5)")


def main(args: argparse.Namespace) -> int:
    model, tokenizer, name = load(args.model)
    input_ids = tokenizer(args.text, return_tensors="pt")["input_ids"]
    result = inspect_model(model, input_ids, args.out, name=name, top_k=args.top_k, pos_dim=args.pos_dim,
                           seeds=args.seeds)
    print(f"{name} ({result['model_type']}, {result['positions']} positions), text of {result['num_tokens']} tokens")
    print(result["summary"])
    print(f"wrote {Path(args.out) / 'inspect.json'} and {', '.join(result['plots']) or 'no plots'}")
    return 0
