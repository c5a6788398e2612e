"""A CPU stand-in for flash-attn 2's `flash_attn_func`, computing its documented maths in fp32 (the
docstring of flash_attn.flash_attn_interface.flash_attn_func, v2.6), so the flash path can run where
flash-attn cannot. Tests put this folder on sys.path; it is never installed.

Every call's keyword arguments are kept in `CALLS`. `CAPABILITY` is the compute capability the stand-in
reports for CPU: flash-attn 2 refuses GPUs before Ampere (8.0) when called, not when imported.
"""

from __future__ import annotations

from typing import Any

import torch

__version__ = "2.6.3+cpu-stand-in"
CALLS: list[dict[str, Any]] = []
CAPABILITY = (8, 0)


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                    softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                    return_attn_probs: bool = False) -> torch.Tensor:
    """q (B, Lq, H, D), k and v (B, Lk, Hk, D), H a multiple of Hk; fp16/bf16. Causal and windows are aligned
    to the bottom-right: query i sits at key slot i + Lk - Lq and sees keys j with i + Lk - Lq - left <= j
    <= i + Lk - Lq + right (-1: unbounded; causal sets right = 0). alibi_slopes (H,) or (B, H) fp32 add
    -slope * |i + Lk - Lq - j| to the scaled score. Rows that see no key output 0."""
    CALLS.append(dict(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                      softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic))
    if CAPABILITY < (8, 0):
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if dropout_p or softcap or return_attn_probs:
        raise NotImplementedError("the stand-in computes no dropout, softcap or attention probabilities")
    if alibi_slopes is not None and alibi_slopes.dtype != torch.float32:
        raise RuntimeError("ALiBi slopes must have dtype fp32")
    batch, q_len, heads, dim = q.shape
    k_len = k.shape[1]
    groups = heads // k.shape[2]
    key, value = (x.float().repeat_interleave(groups, dim=2) for x in (k, v))
    scale = dim**-0.5 if softmax_scale is None else softmax_scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), key) * scale
    slot = torch.arange(q_len, device=q.device)[:, None] + k_len - q_len
    distance = slot - torch.arange(k_len, device=q.device)[None]  # (Lq, Lk): > 0 for keys before the query's slot
    left, right = window_size
    right = 0 if causal else right
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device)
    if left >= 0:
        allowed &= distance <= left
    if right >= 0:
        allowed &= -distance <= right
    if alibi_slopes is not None:
        slopes = alibi_slopes.reshape(-1, heads)[:, :, None, None]  # (1 or B, H, 1, 1)
        scores = scores - slopes * distance.abs()
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num()  # a row with no key: all -inf -> 0
    out = torch.einsum("bhqk,bkhd->bqhd", weights, value)
    return out.to(q.dtype)
