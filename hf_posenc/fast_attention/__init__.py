"""Attention with a positional term and no (L, L) tensor (issue 12): ALiBi, T5, FIRE, KERPLE, TUPE
(`untied`) and Self-Extend at lengths where a materialised (B, H, L, L) bias does not fit.

    out, _ = biased_attention(query, key, value, q_pos=q_pos, k_pos=k_pos, bias=module,
                              mask=MaskSpec(causal=True, key_padding=padding), scaling=scaling)

`bias` is the scheme's module (`scheme.module(options, facts)`: AlibiBias, T5Bias, FireBias, KerpleBias,
UntiedBias, SelfExtendAttention) or None; the same maths feeds every backend (see `terms`). Backends:
`flex` (FlexAttention, compiled once), `chunked` (query blocks + fused sdpa, no compiler), `dense`
(the materialised reference), `flash_alibi` (flash-attn's native ALiBi on CUDA, Dao 2023). `auto` takes
flash_alibi where it applies (and a probe call ran on the device), else flex on CUDA/XPU, else chunked; a
flex compile failure is reported once and falls back to chunked. Calls that train go chunked where flex's
backward cannot run: a term that says `flex_backward = False` (FIRE), or deterministic algorithms on. Not flex on CPU by default: there its first call per (term, mask, length
bucket) compiles for 10-18 s, and it then beats chunked by only ~0.4 s per 8k-token ALiBi call (0.59 s
against 1.01 s, one thread), so a compile pays off after dozens of same-shaped calls; it has no CPU
backward either. `backend="flex"` still runs it there.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException

from ..errors import PosEncError
from . import backends
from .masks import BLOCK, MaskSpec
from .terms import KINDS, Call

__all__ = ["BACKENDS", "MaskSpec", "biased_attention", "choose_backend", "refusal", "runs"]

BACKENDS: dict[str, Callable[[Call], torch.Tensor]] = {
    "flex": backends.flex,
    "chunked": backends.chunked,
    "dense": backends.dense,
    "flash_alibi": backends.flash_alibi,
}
FLEX_DEVICES = ("cuda", "xpu")  # where `auto` takes flex (see the module docstring for CPU)
FLEX_BACKWARD_DEVICES = ("cuda", "xpu")  # where torch has a FlexAttention backward
FLEX_ERRORS = (TorchDynamoException, FailOnRecompileLimitHit)
_flex_failed: set[tuple[str, str]] = set()  # (device type, bias type) whose flex compile failed here
_fell_back: set[tuple[str, str]] = set()  # (backend, reason) already logged by a `fallback` call
LOG = logging.getLogger(__name__)


def biased_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    bias: Any = None,
    mask: Any = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    backend: str = "auto",
    fallback: bool = False,
) -> tuple[torch.Tensor, None]:
    """Softmax attention with the scheme's position term added once, whatever the mask.

    Args:
        query: (B, H, q, D); key, value: (B, Hkv, k, D) with H a multiple of Hkv (grouped heads).
        q_pos: (B, q) positions of the queries; k_pos: (B, k) positions of the keys this layer holds.
        bias: the scheme's module (see the module docstring) or None for plain attention.
        mask: a `MaskSpec` (O(L) data, fastest), an index-space mask_mod(b, h, q_row, key_slot), a
            FlexAttention BlockMask, a (B, 1, q, k) bool or 0/-inf float tensor, or None (no mask).
        scaling: logit scale, default D**-0.5. dropout: attention dropout probability (not with flex).
        backend: "auto", or one of `BACKENDS`.
        fallback: a `backend` that cannot take this call hands it to "auto" instead of raising, with one log
            line per (backend, reason) in the process (a backend forced on a whole model meets decode steps
            and padded batches it cannot run).

    Returns:
        ((B, q, H, D) output, None), as transformers' attention functions. Rows that see no key are 0.
    """
    _check(query, key, value, q_pos, k_pos)
    call = Call(query, key, value, q_pos, k_pos, bias, mask,
                query.shape[-1] ** -0.5 if scaling is None else scaling, dropout)
    name = choose_backend(call) if backend == "auto" else backend
    if name not in BACKENDS:
        raise PosEncError(f"unknown attention backend {backend!r}; choose 'auto' or one of {', '.join(BACKENDS)}")
    reason = refusal(name, call)
    if reason is not None and not fallback:
        raise PosEncError(f"{reason}; use backend='chunked' or 'auto'")
    if reason is not None:
        if (name, reason) not in _fell_back:
            _fell_back.add((name, reason))
            LOG.warning("attention backend %r cannot take some calls (%s): falling back to 'auto' for those", name, reason)
        backend, name = "auto", choose_backend(call)
    if backend == "auto" and name == "flex":
        out = _flex_or_chunked(call)
    else:
        out = BACKENDS[name](call)
    return out.transpose(1, 2).contiguous(), None


def choose_backend(call: Call) -> str:
    """The backend `auto` runs for this call."""
    if backends.flash_alibi_applies(call):
        return "flash_alibi"
    return "flex" if _flex_runs(call) else "chunked"


def refusal(name: str, call: Call) -> str | None:
    """Why backend `name` cannot run this call, or None if it can."""
    if name == "flex":
        if call.dropout:
            return "FlexAttention has no attention dropout"
        device = call.query.device.type
        if call.needs_grad and device not in FLEX_BACKWARD_DEVICES:
            return f"torch has no FlexAttention backward on {device.upper()}"
        if call.needs_grad and not getattr(call.bias, "flex_backward", True):
            return (f"Inductor cannot lower the backward of {type(call.bias).__name__}'s score_mod (it indexes one "
                    "trainable tensor more than once)")
        if call.needs_grad and torch.are_deterministic_algorithms_enabled():
            return "deterministic algorithms are on and FlexAttention's backward scatters gradients with atomic adds"
    if name == "flash_alibi" and not backends.flash_alibi_applies(call):
        return ("flash_alibi needs CUDA fp16/bf16 inputs, flash-attn installed, an ALiBi bias, a causal MaskSpec "
                "without padding or documents, and positions that step by one")
    return None


def runs(term: Any) -> bool:
    """Whether a position term (a scheme's module, or None) has a form the fused backends run."""
    return term is None or any(name is not None and hasattr(term, name) for name in KINDS)


def _flex_runs(call: Call) -> bool:
    device = call.query.device.type
    return (
        device in FLEX_DEVICES
        and call.query.shape[2] >= BLOCK  # shorter: one chunk does it without a compile
        and (device, type(call.bias).__name__) not in _flex_failed
        and refusal("flex", call) is None
    )


def _flex_or_chunked(call: Call) -> torch.Tensor:
    try:
        return backends.flex(call)
    except FLEX_ERRORS as error:
        _flex_failed.add((call.query.device.type, type(call.bias).__name__))
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        warnings.warn(f"FlexAttention failed to compile here ({first_line}); using chunked attention instead",
                      stacklevel=3)
        return backends.chunked(call)


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> None:
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise PosEncError("query, key and value must be (batch, heads, length, head_dim)")
    batch, heads, q_len, _ = query.shape
    if key.shape[:3] != value.shape[:3] or key.shape[0] != batch or heads % key.shape[1]:
        raise PosEncError(f"keys/values {tuple(key.shape)}/{tuple(value.shape)} do not fit queries {tuple(query.shape)} "
                          "(same batch and length, query heads a multiple of key heads)")
    if tuple(q_pos.shape) != (batch, q_len) or tuple(k_pos.shape) != (batch, key.shape[2]):
        raise PosEncError(f"q_pos must be {(batch, q_len)} and k_pos {(batch, key.shape[2])}, "
                          f"got {tuple(q_pos.shape)} and {tuple(k_pos.shape)}")
