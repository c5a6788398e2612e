"""The attention logit split by source: the four terms of added positions, and what RoPE and ALiBi put instead."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..adapters.base import get_module
from ..catalog import adapter_for, get_scheme
from ..config import PosEncConfig
from ..errors import PosEncError
from ..patching import describe
from ..schemes.rotary import rotate
from .positions import Stop, check_length, head_shape, kinds_allowed, position_kind, qk_modules, rotary_module, run_until_stop

TERMS = ("content-content", "content-position", "position-content", "position-position")
BIAS_TERMS = ("content-bias", "position-bias", "bias-content", "bias-position", "bias-bias")


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
    heads, head_dim = head_shape(model)
    q_proj, k_proj = qk_modules(model, 0)
    q = q_proj(hidden)
    if k_proj is None:  # packed [q | k | v]
        q, k = q[..., : heads * head_dim], q[..., heads * head_dim: 2 * heads * head_dim]
    else:
        k = k_proj(hidden)
    return q.reshape(-1, heads, head_dim), k.reshape(-1, heads, head_dim)


@torch.no_grad()
def _layer0_inputs(model: nn.Module, input_ids: Tensor) -> tuple[dict[Any, Tensor], nn.LayerNorm, nn.Module]:
    """What enters layer 0 (word and position vectors, the LayerNorm input feeding its queries), caught by
    hooks in a forward stopped at the query projection; the LayerNorm; the query projection."""
    length = input_ids.shape[1]
    seen: dict[Any, Tensor] = {}

    def keep(key: Any) -> Callable:
        def hook(module: nn.Module, args: Any, output: Tensor) -> None:
            seen[key] = output.detach().float().reshape(-1, length, output.shape[-1])[0]
            if isinstance(module, nn.LayerNorm):
                seen[key, "in"] = args[0].detach().float()[0]
        return hook

    def stop(module: nn.Module, args: Any) -> None:
        seen["q_in"] = args[0].detach().float()[0]
        raise Stop

    # the LayerNorm feeding layer 0's q/k is found by value (BERT: embeddings.LayerNorm, GPT-2: h.0.ln_1)
    norms = [m for m in model.base_model.modules() if isinstance(m, nn.LayerNorm)]
    q_proj = qk_modules(model, 0)[0]
    handles = [model.get_input_embeddings().register_forward_hook(keep("word")),
               get_module(model.base_model, adapter_for(model).slot.path).register_forward_hook(keep("position")),
               q_proj.register_forward_pre_hook(stop),
               *(m.register_forward_hook(keep(m)) for m in norms)]
    try:
        run_until_stop(model, input_ids)
    finally:
        for h in handles:
            h.remove()
    norm = next((m for m in reversed(norms) if m in seen and torch.equal(seen[m], seen["q_in"])), None)
    if norm is None:
        raise PosEncError(
            f"no LayerNorm feeds layer 0's queries and keys directly in {model.config.model_type}; the four-term "
            f"decomposition needs word + position -> LayerNorm -> q/k (allowed: {kinds_allowed('absolute')})"
        )
    seen["norm_in"] = seen[norm, "in"]
    return seen, norm, q_proj


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
            f"{model.config.model_type} has positions: {kind}; allowed: {kinds_allowed('absolute')} "
            f"(learned or an input-site scheme such as sinusoidal). For RoPE models use rotary_profile(), "
            f"for ALiBi alibi_slopes()"
        )
    input_ids = input_ids.reshape(1, -1).to(model.device)
    length = input_ids.shape[1]
    check_length(model, length)
    seen, norm, q_proj = _layer0_inputs(model, input_ids)
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

    scale = head_shape(model)[1] ** -0.5
    terms = {f"{a}-{b}": scale * parts[a][0] @ parts[b][1].transpose(-1, -2)
             for a in ("content", "position", "bias") for b in ("content", "position", "bias")}
    terms = {name: terms[name] for name in TERMS + BIAS_TERMS}
    valid = torch.ones(length, length, dtype=torch.bool, device=x.device)
    if adapter_for(model).causal:
        valid = valid.tril()
    return FourTerms(terms=terms, valid=valid)



def _rotated(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (L, H, d_h) rotated at L positions by cos/sin (L, rot): RoPE on the first rot dims, the rest pass."""
    rot = cos.shape[-1]
    return torch.cat((rotate(x[None, ..., :rot], cos[None], sin[None])[0], x[..., rot:]), dim=-1)


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
                          f"{position_kind(model)}); allowed: {kinds_allowed('rotary')} or a model patched to RoPE")
    input_ids = input_ids.reshape(1, -1).to(model.device)
    check_length(model, input_ids.shape[1])
    heads, head_dim = head_shape(model)
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
        q_proj, k_proj = qk_modules(model, i)
        # prepend: run before a patch's own hook rotates the projection output in place of the model
        handles.append(q_proj.register_forward_hook(keep(i, "q" if k_proj else "qkv"), prepend=True))
        if k_proj is not None:
            handles.append(k_proj.register_forward_hook(keep(i, "k"), prepend=True))
    try:
        model.base_model(input_ids=input_ids)
    finally:
        for h in handles:
            h.remove()
    distances = torch.arange(max_distance, device=model.device)
    cos, sin = rotary_module(model)(torch.zeros(1, device=distances.device), distances[None])
    cos, sin = cos[0].float(), sin[0].float()  # (D, rot_dim)
    scale = head_dim**-0.5
    curves = []
    for i in range(layers):
        q, k = seen[("q", i)].mean(0), seen[("k", i)].mean(0)  # (heads, d_h), (kv heads, d_h)
        k = k.repeat_interleave(heads // k.shape[0], dim=0)
        # query at position delta, key at position 0: R_0 only applies the rotary scaling factor
        q_rot = _rotated(q.expand(max_distance, -1, -1), cos, sin)  # (D, heads, d_h)
        k_rot = _rotated(k[None], cos[:1], sin[:1])
        curves.append(scale * (q_rot * k_rot).sum(-1).T)  # (heads, D)
    ones = torch.ones(1, 1, head_dim, device=cos.device)
    reference = scale * (_rotated(ones.expand(max_distance, -1, -1), cos, sin) * _rotated(ones, cos[:1], sin[:1])).sum(-1)[:, 0]
    return {"distances": distances.tolist(), "layers": [c.tolist() for c in torch.stack(curves).cpu()],
            "reference_ones": reference.cpu().tolist(), "head_dim": head_dim,
            "rotary_dim": int((sin.abs().amax(0) > 0).sum())}  # a partial patch pads cos=1, sin=0



def distance_slopes(model: nn.Module) -> list[float] | None:
    """The per-head slopes m_h of a patch whose score bias is -m_h * distance (ALiBi, Press et al. 2022), else None."""
    patched = describe(model)
    if not isinstance(patched, PosEncConfig):
        return None
    slopes = get_scheme(patched.scheme).distance_slopes(patched.options, head_shape(model)[0])
    return None if slopes is None else slopes.tolist()


def alibi_slopes(model: nn.Module) -> list[float]:
    """ALiBi's per-head slopes m_h: the score bias is -m_h * distance (Press et al. 2022)."""
    slopes = distance_slopes(model)
    if slopes is None:
        raise PosEncError(f"{model.config.model_type} has no ALiBi bias (positions: {position_kind(model)}); "
                          f"allowed: a model patched with hf_posenc.patch(model, 'alibi')")
    return slopes


@torch.no_grad()
def rotary_cos(model: nn.Module, length: int) -> Tensor:
    """cos(m * theta_j) for positions m < length and each rotary frequency j, (length, rot_dim / 2)."""
    positions = torch.arange(length, device=model.device)[None]
    cos, _ = rotary_module(model)(torch.zeros(1, device=positions.device), positions)
    return cos[0, :, : cos.shape[-1] // 2].float().cpu()
