"""The attention functions of score- and attention-site schemes (`posenc_sdpa`, `posenc_eager`).

They are registered under new implementation names with transformers' AttentionInterface and, with the
stock sdpa mask function, AttentionMaskInterface (with only the first, transformers builds no mask and
padding is silently ignored). The scheme's bias is added here, in the one place every path goes through,
rather than in the mask function, which transformers skips when the caller hands it a ready 4-D mask.

Contract (what a FlexAttention or query-chunked path must also honour):

- `posenc_positions`: a `Positions` with the (B, q) positions of this call's queries and the (B, k)
  positions of every key the model holds, past and present, from the one source of truth (the layer-loop
  hook: explicit `position_ids`, else the padding mask, and positions of cached keys recorded in the cache).
  `fit_keys` aligns them with the keys this layer holds (sliding windows keep a suffix, static caches pad).
- `posenc_bias`: a callable `(q_pos (B, q), k_pos (B, k)) -> (B|1, H, q, k)` fp32 logit bias, written
  with elementwise ops of (head, q_pos, k_pos) so it can also be evaluated pointwise.
- `posenc_logits`: a callable `(query, key, q_pos, k_pos) -> (B, H, q, k)` fp32 q.k logits replacing
  the product (schemes that must see positions of both sides inside the product: Self-Extend, xPos).
- whatever mask arrives -- None (transformers skipped a plain causal or full mask), a bool 4-D mask
  (True = attend), a float 4-D additive mask (user-made, or packed block-diagonal) -- the bias is added
  exactly once, bool masks are converted explicitly, and nothing masked is ever unmasked.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from . import compat
from .errors import PosEncError

PREFIX = "posenc_"
POSITIONS_KWARG = "posenc_positions"
BIAS_KWARG = "posenc_bias"
LOGITS_KWARG = "posenc_logits"
BASES = ("sdpa", "eager")


class Positions(NamedTuple):
    """Positions of one forward: `queries` (B, q) of the new tokens, `keys` (B, k) of all keys so far, and
    the masks built from them so far in this forward (layers of one kind share theirs)."""

    queries: torch.Tensor
    keys: torch.Tensor
    masks: list[tuple[Any, ...]]


def implementation_for(current: str) -> str:
    """The biased implementation name standing in for `current` (sdpa or eager)."""
    base = current.removeprefix(PREFIX)
    if base not in BASES:
        raise PosEncError(
            f"attention biases need attn_implementation 'sdpa' or 'eager', this model uses {current!r}; "
            "load it with attn_implementation='sdpa' (flash attention takes no float bias)"
        )
    return PREFIX + base


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


def with_positions(attention: Callable) -> Callable:
    """The stock attention `attention`, run after adding the scheme's position term (see the module
    docstring for the contract)."""

    def positioned_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        positions: Positions | None = kwargs.pop(POSITIONS_KWARG, None)
        bias_fn = kwargs.pop(BIAS_KWARG, None)
        logits_fn = kwargs.pop(LOGITS_KWARG, None)
        if positions is None:
            raise PosEncError("posenc attention called without positions: a patched attention module was called "
                              "outside its model, or the model was unpatched while its implementation stayed posenc_*")
        kv_length, q_length = key.shape[-2], query.shape[-2]
        causal = kwargs.pop("is_causal", None)
        causal = getattr(module, "is_causal", False) if causal is None else causal
        if logits_fn is None:
            mask = position_mask(positions, attention_mask, bias_fn, causal, q_length, kv_length, query.dtype, query.device)
            return attention(module, query, key, value, mask, **kwargs)
        mask = position_mask(positions, attention_mask, bias_fn, causal, q_length, kv_length, torch.float32, query.device)
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        logits = logits_fn(query, key, positions.queries, fit_keys(positions.keys, kv_length))
        return eager_attention(module, query, key, value, mask, logits=logits, **kwargs)

    return positioned_attention


compat.register_attention(PREFIX + "sdpa", with_positions(compat.base_attention_function("sdpa")),
                          compat.base_mask_function("sdpa"))
compat.register_attention(PREFIX + "eager", with_positions(eager_attention), compat.base_mask_function("sdpa"))
