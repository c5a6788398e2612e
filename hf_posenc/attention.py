"""The attention functions of score- and attention-site schemes (`posenc_sdpa`, `posenc_eager`).

They are registered under new implementation names with transformers' AttentionInterface and, with the
stock sdpa mask function, AttentionMaskInterface. The scheme's bias is added here, in the one place every path
goes through, rather than in the mask function, which transformers skips when the caller hands it a ready 4-D mask.

Only the attention modules the patch positions dispatch to them: each reads a `PositionedConfig`, a view of its
model's config whose implementation is the posenc_ one standing in for the model's. The model's own config keeps
transformers' name (`sdpa`, `eager`), which its Trainer, DeepSpeed and user code branch on and which
`set_attn_implementation` switches; the model builds its stock mask for that name, and cross-attention or layers
a per-layer patch leaves alone run the stock attention.

Contract (what a FlexAttention or query-chunked path must also honour):

- `posenc_positions`: a `Positions` with the (B, q) positions of this call's queries and the (B, k)
  positions of every key the model holds, past and present, from the one source of truth (the layer-loop
  hook: explicit `position_ids`, else the padding mask, and positions of cached keys recorded in the cache).
  `fit_keys` aligns them with the keys this layer holds (sliding windows keep a suffix, static caches pad).
- `posenc_bias`: a callable `(q_pos (B, q), k_pos (B, k)) -> (B|1, H, q, k)` fp32 logit bias, written
  with elementwise ops of (head, q_pos, k_pos) so it can also be evaluated pointwise.
- `posenc_logits`: a callable `(query, key, q_pos, k_pos) -> (B, H, q, k)` fp32 q.k logits replacing
  the product (schemes that must see positions of both sides inside the product: Self-Extend, xPos, PoPE);
  one with `reads_mask = True` also gets `mask=`, the additive fp32 mask (CoPE counts only visible keys).
- whatever mask arrives -- None (transformers skipped a plain causal or full mask), a bool 4-D mask
  (True = attend), a float 4-D additive mask (user-made, or packed block-diagonal) -- the bias is added
  exactly once, bool masks are converted explicitly, and nothing masked is ever unmasked.

Backends (issue 12): materialising that mask is O(L^2) memory and keeps sdpa off its fused kernels, so
`posenc_sdpa` hands calls with at least `DENSE_SCORES` scores per head to `hf_posenc.fast_attention` (`auto`:
flash-attn's ALiBi on CUDA where it applies, FlexAttention on CUDA, query-chunked sdpa elsewhere), with
the same positions and mask. `posenc_eager` always materialises: it is the reference. The environment
variable `HF_POSENC_ATTENTION` (or `attention_backend(name)` in code) forces one of `BACKEND_CHOICES`
for `posenc_sdpa`; `dense` is today's materialised path. A forced backend hands the calls it cannot take
(flash_alibi: decode steps, padded batches) to `auto`, said once per reason in the log.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import nn

from . import compat
from . import fast_attention as fast
from .errors import PosEncError

PREFIX = "posenc_"
POSITIONS_KWARG = "posenc_positions"
BIAS_KWARG = "posenc_bias"
LOGITS_KWARG = "posenc_logits"
BASES = ("sdpa", "eager")
BACKEND_ENV = "HF_POSENC_ATTENTION"
BACKEND_CHOICES = ("auto", "dense", "chunked", "flex", "flash_alibi")
# Below this many scores (queries x keys) per head the materialised mask is small and dense sdpa as fast.
# Tiny Llama forward, one thread, dense / chunked ms: ALiBi 38/39 at 256 tokens, 93/81 at 512, 225/181 at
# 1k; T5 61/60, 133/120, 373/276. Decode steps (one query) stay dense: 170 against 155 tokens/s at 2k.
DENSE_SCORES = 512 * 512
SETTINGS = {"backend": os.environ.get(BACKEND_ENV, "auto")}


class Positions(NamedTuple):
    """Positions of one forward: `queries` (B, q) of the new tokens, `keys` (B, k) of all keys so far, and
    the masks built from them so far in this forward (layers of one kind share theirs)."""

    queries: torch.Tensor
    keys: torch.Tensor
    masks: list[tuple[Any, ...]]


def implementation_for(current: str) -> str:
    """The biased implementation name standing in for `current` (sdpa or eager)."""
    if current not in BASES:
        raise PosEncError(
            f"attention biases need attn_implementation 'sdpa' or 'eager', this model uses {current!r}; "
            "set it with model.set_attn_implementation('sdpa') (flash attention takes no float bias)"
        )
    return PREFIX + current


class PositionedConfig:
    """The config an attention module the patch positions reads: its model's config (every read and write goes
    there), except the implementation it dispatches on, the posenc_ one standing in for the model's. Plain data
    with a module-level class, so `deepcopy` and `torch.save` of the model copy it with the config it views."""

    def __init__(self, config: Any) -> None:
        self.__dict__["viewed"] = config

    @property
    def _attn_implementation(self) -> str:
        return implementation_for(self.viewed._attn_implementation)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "viewed":  # copy and pickle probe dunders before __dict__ is filled
            raise AttributeError(name)
        return getattr(self.viewed, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.viewed, name, value)


def fit_keys(k_pos: torch.Tensor, kv_length: int) -> torch.Tensor:
    """Key positions for the keys a layer holds: the last `kv_length` (sliding caches keep the newest keys,
    in order) or padded with zeros (a static cache holds unused slots, which its mask hides)."""
    if k_pos.shape[-1] >= kv_length:
        return k_pos[:, k_pos.shape[-1] - kv_length :]
    return torch.cat((k_pos, k_pos.new_zeros(k_pos.shape[0], kv_length - k_pos.shape[-1])), dim=-1)


def biased_mask(attention_mask: torch.Tensor | None, bias: torch.Tensor | None, causal: bool, q_length: int,
                kv_length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """One additive float mask (B|1, H|1, q, k) in `dtype` from any mask plus an optional fp32 bias.

    None means transformers skipped the mask: causal (top-left aligned, as sdpa's `is_causal`) when
    several queries arrive, else attend everywhere. Masked entries stay at the dtype's minimum whatever
    the bias adds (the clamp keeps -inf out: a fully masked padding row would turn into NaN)."""
    low = torch.finfo(dtype).min
    if attention_mask is None:
        if not (causal and q_length > 1):
            return None if bias is None else bias.to(dtype)
        attention_mask = torch.arange(kv_length, device=device) <= torch.arange(q_length, device=device)[:, None]
    attention_mask = attention_mask[..., :kv_length]
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, 0.0 if bias is None else bias, low).to(dtype)
    mask = attention_mask.float() if bias is None else attention_mask.float() + bias
    return mask.clamp(min=low).to(dtype)


def position_mask(positions: Positions, attention_mask: torch.Tensor | None, bias_fn: Callable | None, causal: bool,
                  q_length: int, kv_length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """`biased_mask` of the scheme's bias for the keys this layer holds. Layers that get the same mask
    and hold as many keys reuse it within a forward (as the stock mask is built once), unless the bias
    has weights to differentiate (gradient checkpointing recomputes each layer on its own)."""
    trains = torch.is_grad_enabled() and bias_fn is not None and any(p.requires_grad for p in bias_fn.parameters())
    reuse = not trains and not torch.compiler.is_compiling()
    if reuse:
        for mask, length, kind, made in positions.masks:
            if mask is attention_mask and length == kv_length and kind == dtype:
                return made
    bias = bias_fn(positions.queries, fit_keys(positions.keys, kv_length)) if bias_fn is not None else None
    made = biased_mask(attention_mask, bias, causal, q_length, kv_length, dtype, device)
    if reuse:
        positions.masks.append((attention_mask, kv_length, dtype, made))
    return made


@contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """Run `posenc_sdpa` on backend `name` (one of `BACKEND_CHOICES`) inside the block."""
    check_backend(name)
    before, SETTINGS["backend"] = SETTINGS["backend"], name
    try:
        yield
    finally:
        SETTINGS["backend"] = before


def check_backend(name: str) -> str:
    if name not in BACKEND_CHOICES:
        raise PosEncError(f"{BACKEND_ENV}={name!r} is not an attention backend; choose one of {', '.join(BACKEND_CHOICES)}")
    return name


def fused_mask(attention_mask: torch.Tensor | None, causal: bool, q_length: int, kv_length: int) -> Any:
    """The mask as `fast_attention` takes it, meaning what it means in `biased_mask`; False when only
    the dense path can honour it (a mask per head, or an additive float mask holding values other than
    0 and masked, which only a materialised sum keeps exact)."""
    if attention_mask is None:
        return fast.MaskSpec(causal=True, q_offset=0) if causal and q_length > 1 else None
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        return False
    mask = attention_mask[..., :kv_length]
    if mask.dtype == torch.bool:
        return mask
    if torch.compiler.is_compiling():  # the value check below is data-dependent
        return False
    masked = mask <= torch.finfo(mask.dtype).min / 2
    return mask if bool(((mask == 0) | masked).all()) else False


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                    term: nn.Module | None, positions: Positions, causal: bool, kwargs: dict[str, Any]) -> Any:
    """`fast_attention` on this call, or None where the dense path should run (short inputs under
    `auto`, or what no fused backend can express)."""
    backend = check_backend(SETTINGS["backend"])
    kv_length = key.shape[-2]
    small = query.shape[-2] * kv_length < DENSE_SCORES
    if backend == "dense" or (backend == "auto" and small) or not fast.runs(term):
        return None
    mask = fused_mask(attention_mask, causal, query.shape[-2], kv_length)
    if mask is False:
        if backend == "auto":
            return None
        raise PosEncError(f"backend {backend!r} takes bool masks and float masks of 0 and -inf only; this "
                          f"{attention_mask.dtype} {tuple(attention_mask.shape)} mask needs {BACKEND_ENV}=dense or auto")
    batch = query.shape[0]
    out, _ = fast.biased_attention(
        query, key, value, q_pos=positions.queries.expand(batch, -1),
        k_pos=fit_keys(positions.keys, kv_length).expand(batch, -1), bias=term, mask=mask,
        scaling=kwargs.get("scaling"), dropout=kwargs.get("dropout", 0.0), backend=backend, fallback=True)
    return out.to(query.dtype), None


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    logits: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention on (B, H, L, D) inputs with grouped KV heads; softmax in fp32. `logits`
    (fp32, unscaled) replaces the q.k product; `attention_mask` is additive float or None."""
    groups = query.shape[1] // value.shape[1]
    value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if logits is None:
        logits = torch.matmul(query, key.repeat_interleave(groups, dim=1).transpose(2, 3))
    weights = logits.float() * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def with_positions(attention: Callable, fused: bool) -> Callable:
    """The stock attention `attention`, run after adding the scheme's position term (see the module
    docstring for the contract); `fused`: long calls go to `fast_attention` instead."""

    def positioned_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        positions: Positions | None = kwargs.pop(POSITIONS_KWARG, None)
        bias_fn = kwargs.pop(BIAS_KWARG, None)
        logits_fn = kwargs.pop(LOGITS_KWARG, None)
        if positions is None:
            raise PosEncError("posenc attention called without positions: a patched attention module was called "
                              "outside its model")
        kv_length, q_length = key.shape[-2], query.shape[-2]
        causal = kwargs.pop("is_causal", None)
        causal = getattr(module, "is_causal", False) if causal is None else causal
        if fused and (bias_fn is None or logits_fn is None):
            out = fused_attention(query, key, value, attention_mask, logits_fn or bias_fn, positions, causal, kwargs)
            if out is not None:
                return out
        if logits_fn is None:
            mask = position_mask(positions, attention_mask, bias_fn, causal, q_length, kv_length, query.dtype, query.device)
            return attention(module, query, key, value, mask, **kwargs)
        mask = position_mask(positions, attention_mask, bias_fn, causal, q_length, kv_length, torch.float32, query.device)
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        # a scheme whose logits depend on which keys a query sees (CoPE's counting gates) reads the mask too
        seen = {"mask": mask} if getattr(compat.running_module(logits_fn), "reads_mask", False) else {}
        logits = logits_fn(query, key, positions.queries, fit_keys(positions.keys, kv_length), **seen)
        return eager_attention(module, query, key, value, mask, logits=logits, **kwargs)

    return positioned_attention


compat.register_attention(PREFIX + "sdpa", with_positions(compat.base_attention_function("sdpa"), fused=True),
                          compat.base_mask_function("sdpa"))
compat.register_attention(PREFIX + "eager", with_positions(eager_attention, fused=False), compat.base_mask_function("sdpa"))
