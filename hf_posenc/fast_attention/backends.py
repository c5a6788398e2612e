"""The kernels. Each returns the (B, H, q, Dv) attention output; rows that may see no key are zero
(FlexAttention's convention, kept by every backend so they agree everywhere).

- `flex`: torch's FlexAttention, compiled once per process and reused (automatic dynamic shapes: the
  first length compiles a static kernel, the second a dynamic one that serves every later length);
- `chunked`: no compiler; query blocks of bounded size, each with its bias and mask built for that
  block only and the keys it can see (memory O(L * chunk)), run by fused sdpa; recomputed in backward.
  Where positions step by one and the mask is a band of slot distances (no padding or packing), a
  bias of the distance alone (ALiBi, T5, KERPLE) makes each block a Toeplitz matrix: it is built as a
  strided view of H x (rows + keys) values, with the block's rows reversed so the view's strides are
  positive -- no (rows, keys) tensor is computed at all. No bias and a plain causal mask: one sdpa call;
- `dense`: the materialised reference (the scheme's own (B, H, q, k) bias, fp32 softmax);
- `flash_alibi`: flash-attn's native ALiBi (CUDA, fp16/bf16 only; on CPU only through the test stand-in,
  tests/stand_ins/flash_attn, which computes its documented maths).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention
from torch.utils.checkpoint import checkpoint

from .masks import BLOCK, NO_WINDOW, Mask, MaskSpec, SpecMask
from .terms import Call, Problem, dense_logits, pad_value

CHUNK_ELEMENTS = 2**23  # scores per query block (B * H * rows * keys): a 32 MB fp32 bias
MIN_CHUNK = 16
RECOMPILE_LIMIT = 64  # flex compiles one kernel per (bias, mask) code and bucketed shape
LOG = logging.getLogger(__name__)
FLASH_DEVICES = ("cuda",)  # device types flash-attn has kernels for (tests point it at a CPU stand-in)


@functools.cache
def compiled_flex() -> Any:
    return torch.compile(flex_attention, dynamic=False)


def bucket(length: int) -> int:
    """Length rounded up to a multiple of max(128, 2^floor(log2 length) / 4): at most 4 kernels per
    octave of lengths, at most 25% padding."""
    step = max(BLOCK, 2 ** max(length.bit_length() - 3, 0))
    return -(-length // step) * step


def flex_arguments(call: Call) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, Any]]:
    """flex_attention's (query, key, value) and keyword arguments for this call, on lengths padded to
    their `bucket`: static shapes, as torch 2.13's CPU flex template miscompiles dynamic shapes (symbol
    names clash, e.g. `cur_kvSplitSize7`) and single query rows."""
    problem = call.padded(bucket(call.query.shape[2]), bucket(call.key.shape[2])).problem()
    query, key, value = problem.query, problem.key, problem.value
    bias_mod = problem.bias_mod
    score_mod = None if bias_mod is None else (lambda score, b, h, q, kv: score + bias_mod(b, h, q, kv))
    kwargs = dict(score_mod=score_mod, block_mask=problem.mask.block_mask(), scale=call.scaling,
                  enable_gqa=query.shape[1] != key.shape[1])
    return (query, key, value), kwargs


def flex(call: Call) -> torch.Tensor:
    rows = call.query.shape[2]
    (query, key, value), kwargs = flex_arguments(call)
    if torch.compiler.is_compiling():  # inside a compiled model: the outer compile fuses it
        return flex_attention(query, key, value, **kwargs)[:, :, :rows]
    # A silent fallback to uncompiled flex would materialise every score: fail loudly instead.
    limits = torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True)
    with limits:
        return compiled_flex()(query, key, value, **kwargs)[:, :, :rows]


def chunk_rows(batch: int, heads: int, keys: int) -> int:
    return max(MIN_CHUNK, CHUNK_ELEMENTS // max(1, batch * heads * keys))


def chunked(call: Call) -> torch.Tensor:
    problem = call.problem()
    scaling, dropout = call.scaling, call.dropout
    value, width = pad_value(problem)
    query, key, mask = problem.query, problem.key, problem.mask
    batch, heads, q_len, _ = query.shape
    band = distance_band(problem, call)
    gqa = query.shape[1] != key.shape[1]
    if problem.bias_mod is None and band is not None and band[1:] == (None, True) and (band[0] == 0 or q_len == 1):
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling, is_causal=q_len > 1,
                                              enable_gqa=gqa)[..., :width]
    rows = chunk_rows(batch, heads, key.shape[2])
    grad = call.needs_grad
    outs = []
    for r0 in range(0, q_len, rows):
        r1 = min(r0 + rows, q_len)
        run = _band_rows if band is not None else _rows
        block = functools.partial(run, problem, mask, band, key, value, scaling, dropout, r0, r1)
        # Recomputing each block in backward keeps its bias out of the autograd graph: O(L * chunk) there too.
        outs.append(checkpoint(block, query[:, :, r0:r1], use_reentrant=False) if grad else block(query[:, :, r0:r1]))
    return torch.cat(outs, dim=2)[..., :width]


def distance_band(problem: Problem, call: Call) -> tuple[int, int | None, bool] | None:
    """The mask's slot band (see `SpecMask.band`) when the position term is a function of the distance
    alone (or absent) and positions are slots plus a constant per row, so position and slot distances
    agree; else None."""
    if problem.bias_mod is not None and problem.by_distance is None:
        return None
    band = problem.mask.band() if isinstance(problem.mask, SpecMask) else None
    if band is None or problem.bias_mod is None:
        return band
    q_pos, k_pos = problem.positions
    start = k_pos[:, :1]
    steps = torch.arange(k_pos.shape[1], device=k_pos.device)
    if not bool((k_pos - start == steps).all() and (q_pos - start == band[0] + steps[: q_pos.shape[1]]).all()):
        return None
    return band


def _band_rows(problem: Problem, mask: Mask, band: tuple[int, int | None, bool], key: torch.Tensor,
               value: torch.Tensor, scaling: float, dropout: float, r0: int, r1: int, query: torch.Tensor) -> torch.Tensor:
    """Rows [r0, r1) through the Toeplitz view: row i of the reversed block and key j are at slot
    distance top - (i + j), so value m of one (H, rows + keys - 1) row serves every (i, j) with i + j = m."""
    offset, window, causal = band
    lo, hi = mask.key_span(r0, r1)
    top = offset + r1 - 1 - lo
    distance = top - torch.arange(r1 - r0 + hi - lo - 1, device=query.device)
    allowed = (distance >= 0) & (distance < (window or NO_WINDOW)) if causal else distance.abs() <= (window or NO_WINDOW)
    if problem.by_distance is None:
        values = torch.zeros(1, distance.shape[0], dtype=query.dtype, device=query.device)
    else:
        heads = torch.arange(query.shape[1], device=query.device)[:, None]
        values = problem.by_distance(heads, distance[None]).to(query.dtype)
    values = values.masked_fill(~allowed, torch.finfo(query.dtype).min)
    out = masked_sdpa(query.flip(2), key[:, :, lo:hi], value[:, :, lo:hi], values.unfold(-1, hi - lo, 1)[None],
                      dropout, scaling)
    return out.flip(2)


def _rows(problem: Problem, mask: Mask, band: None, key: torch.Tensor, value: torch.Tensor, scaling: float,
          dropout: float, r0: int, r1: int, query: torch.Tensor) -> torch.Tensor:
    lo, hi = mask.key_span(r0, r1)
    if hi <= lo:
        return query.new_zeros(*query.shape[:3], value.shape[-1])
    allowed = mask.dense(r0, r1, lo, hi)
    bias = torch.zeros((), dtype=query.dtype, device=query.device)
    if problem.bias_mod is not None:  # the module's own (B, H, rows, keys) form: fewer passes than score by score
        q_pos, k_pos = problem.positions
        bias = problem.materialised(q_pos[:, r0:r1], k_pos[:, lo:hi]).to(query.dtype)
    # min, not -inf, where masked: a row with no key gives uniform weights (zeroed below), never NaN.
    attn_mask = bias.masked_fill(~allowed, torch.finfo(query.dtype).min)
    out = masked_sdpa(query, key[:, :, lo:hi], value[:, :, lo:hi], attn_mask, dropout, scaling)
    return out.masked_fill(~allowed.any(-1, keepdim=True), 0)


def masked_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor, dropout: float,
                scaling: float) -> torch.Tensor:
    """sdpa with a mask, grouped key/value heads repeated to the query heads first: on CUDA, enable_gqa with
    an attn_mask runs only on the math kernel. Inside a block, so backward recomputes the copy."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout, scale=scaling)


def dense(call: Call) -> torch.Tensor:
    query, key, value = call.query, call.key, call.value
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    allowed = call.resolved_mask().dense(0, query.shape[2])
    logits = dense_logits(call.bias, query, key, call.q_pos, call.k_pos, call.scaling)
    logits = logits.masked_fill(~allowed, torch.finfo(torch.float32).min)
    weights = F.dropout(torch.softmax(logits, dim=-1), p=call.dropout)
    out = weights.to(value.dtype) @ value
    return out.masked_fill(~allowed.any(-1, keepdim=True), 0)


def flash_alibi_applies(call: Call) -> bool:
    """flash-attn adds -m_h |i + k - q - j| by index: right only when positions are slot indices up to a
    shift, the mask causal and nothing padded or packed."""
    query, bias, mask, q_pos, k_pos = call.query, call.bias, call.mask, call.q_pos, call.k_pos
    if query.device.type not in FLASH_DEVICES or query.dtype not in (torch.float16, torch.bfloat16):
        return False
    if not hasattr(bias, "slopes"):
        return False
    if not isinstance(mask, MaskSpec) or not mask.causal or mask.key_padding is not None or mask.documents is not None:
        return False
    if mask.q_offset is not None and not bool(torch.all(torch.as_tensor(mask.q_offset) == k_pos.shape[1] - q_pos.shape[1])):
        return False
    if not flash_runs(query.device, query.dtype):
        return False
    steps = torch.arange(k_pos.shape[1], device=k_pos.device)
    return bool(((k_pos - k_pos[:, :1]) == steps).all() and (q_pos == k_pos[:, -q_pos.shape[1]:]).all())


@functools.cache
def flash_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether flash-attn runs here. It imports on GPUs it has no kernels for (before Ampere: T4, V100) and
    in wheels built for another torch, and fails only when called: so a tiny call decides, once per device."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from flash_attn import flash_attn_func

        x = torch.zeros(1, 1, 1, 64, device=device, dtype=dtype)
        flash_attn_func(x, x, x, causal=True, alibi_slopes=torch.zeros(1, device=device))
    except Exception as error:  # any build or device failure (RuntimeError, OSError: undefined symbol, ...)
        LOG.warning("flash-attn does not run on %s (%s: %s); ALiBi attention uses the other backends there",
                    device, type(error).__name__, error)
        return False
    return True


def flash_alibi(call: Call) -> torch.Tensor:
    from flash_attn import flash_attn_func

    window = (-1, -1) if call.mask.sliding_window is None else (call.mask.sliding_window - 1, 0)
    q, k, v = (x.transpose(1, 2) for x in (call.query, call.key, call.value))
    out = flash_attn_func(q, k, v, dropout_p=call.dropout, softmax_scale=call.scaling, causal=True,
                          window_size=window, alibi_slopes=call.bias.slopes.float(),
                          deterministic=torch.are_deterministic_algorithms_enabled())  # its backward, else atomic
    return out.transpose(1, 2)
