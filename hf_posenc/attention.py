"""Score-site schemes: a float bias added to attention logits, built once per forward by a mask
function registered with transformers' AttentionMaskInterface (plus the matching attention function
under the same new name, or transformers would build no mask and ignore padding). The attention
functions also take learned biases and logit replacements passed down by the layer-loop hook."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from . import compat
from .errors import PosEncError
from .registry import adapter_for, get_scheme

PREFIX = "posenc_"
BIAS_KWARG = "posenc_bias"  # private kwarg: key_length -> (B, H, q, k) learned bias
SCORES_KWARG = "posenc_scores"  # private kwarg: (query, key) -> (B, H, q, k) logits
BASES = ("sdpa", "eager")


def implementation_for(current: str) -> str:
    """The biased implementation name standing in for `current` (sdpa or eager)."""
    base = current.removeprefix(PREFIX)
    if base not in BASES:
        raise PosEncError(
            f"attention biases need attn_implementation 'sdpa' or 'eager', this model uses {current!r}; "
            "load it with attn_implementation='sdpa' (flash attention takes no float bias)"
        )
    return PREFIX + base


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    scores: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention on (B, H, L, D) inputs with grouped KV heads; softmax in fp32.
    `scores(query, key)` replaces the q.k product (schemes that rotate inside attention)."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    logits = scores(query, key).to(query.dtype) if scores is not None else torch.matmul(query, key.transpose(2, 3))
    weights = logits * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def score_bias(config: Any, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
    """(H, q, k) fp32 parameter-free bias of the score-site scheme in `config.posenc` (None if learned)."""
    posenc = config.posenc
    scheme = get_scheme(posenc["scheme"])
    if scheme.site != "score":
        return None
    return scheme.bias(posenc["options"], config.num_attention_heads, q_pos, k_pos, adapter_for(config).causal)


def biased_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    config: Any = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> torch.Tensor:
    """The stock boolean mask (causal/bidirectional, sliding window, padding) turned into a float
    (B, H, q, kv) mask carrying the scheme's bias where attention is allowed."""
    for skip in ("allow_is_causal_skip", "allow_is_bidirectional_skip"):
        kwargs.pop(skip, None)
    allowed = compat.base_mask_function("sdpa")(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        attention_mask=attention_mask, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
        device=device, **kwargs,
    )
    q_pos = torch.arange(q_length, device=device) + q_offset
    k_pos = torch.arange(kv_length, device=device) + kv_offset
    bias = score_bias(config, q_pos, k_pos)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero if bias is None else bias.to(dtype)[None], torch.finfo(dtype).min)


def with_positions(attention: Callable) -> Callable:
    """Runs the stock attention after applying what the layer loop passed down as private kwargs:
    a learned bias (computed here for the keys this layer actually holds) added to the float mask,
    or a replacement of the q.k logits, which only the eager math can take."""

    def positioned_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        bias_fn = kwargs.pop(BIAS_KWARG, None)
        if bias_fn is not None:
            bias = bias_fn(key.shape[-2]).to(query.dtype)
            mask = attention_mask[..., : key.shape[-2]] if attention_mask is not None else 0
            attention_mask = (mask + bias).clamp(min=torch.finfo(query.dtype).min)
        scores = kwargs.pop(SCORES_KWARG, None)
        if scores is not None:
            return eager_attention(module, query, key, value, attention_mask, scores=scores, **kwargs)
        return attention(module, query, key, value, attention_mask, **kwargs)

    return positioned_attention


compat.register_attention(PREFIX + "sdpa", with_positions(compat.base_attention_function("sdpa")), biased_mask)
compat.register_attention(PREFIX + "eager", with_positions(eager_attention), biased_mask)
