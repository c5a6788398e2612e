"""How each kind of position term becomes something a fused kernel can run. One registry entry per
kind, found by the method the scheme's module offers:

- `score(head, q_pos, k_pos)` (alibi, t5, fire, kerple): an elementwise bias, evaluated score by score
  in index space (`bias_mod`) -- FlexAttention's score_mod, or one block of rows at a time;
- `factors(q_pos, k_pos)` (untied / TUPE): a low-rank bias q_f . k_f, appended to q and k as extra
  head dimensions, so the kernel needs no bias at all (any fused sdpa runs it);
- `rotated_pair(query, key, q_pos, k_pos)` (self_extend): two rotations of the same q and k. Keys are
  laid out twice, [true-rotated | grouped-rotated], with q = [q_true, q_grouped] and zeros in the other
  half of each key, and the mask lets a query see the first copy of a key inside the window and the
  second beyond it: one softmax over both copies is exactly Self-Extend (Jin et al. 2024, eq. 3-4);
- `transformed(query, key, q_pos, k_pos)` (xpos): q and k rotated and decayed separately, so plain
  attention on them is the scheme (Sun et al. 2022); kept in fp32, as the decay spans many decades.

`dense_logits` gives each kind's materialised (B, H, q, k) logits from the scheme's own forward, the
reference the fused forms are tested against.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..errors import PosEncError
from .masks import BLOCK, Mask, block_ranges, tails_partial, plain, resolve

BiasMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Call:
    """One attention call as the caller gave it: (B, H, q, D) queries, (B, Hkv, k, D) keys and values,
    (B, q) / (B, k) positions, the position term (a scheme's module, or None) and the mask."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    bias: Any
    mask: Any
    scaling: float
    dropout: float
    lengths: tuple[int, int] | None = None  # real (q, k) lengths when the tensors are padded past them

    @property
    def needs_grad(self) -> bool:
        """Whether autograd will differentiate this call (q, k, v or the term's parameters)."""
        params = self.bias.parameters() if isinstance(self.bias, torch.nn.Module) else ()
        return torch.is_grad_enabled() and any(t.requires_grad for t in (self.query, self.key, self.value, *params))

    def resolved_mask(self) -> Mask:
        sizes = (self.query.shape[2], self.key.shape[2])
        real = self.lengths or sizes
        return resolve(self.mask, self.query.shape[0], *real, self.query.device, padded_to=sizes)

    def padded(self, q_len: int, k_len: int) -> Call:
        """The same call on inputs padded to (q_len, k_len); padded rows and key slots are masked.
        Positions become fresh copies (a flex kernel cannot capture views); q, k, v are copied only
        when they grow."""

        def grow(x: torch.Tensor, extra: int, dim: int) -> torch.Tensor:
            return F.pad(x, (0, 0) * (x.dim() - 1 - dim) + (0, extra)) if extra else x

        dq, dk = q_len - self.query.shape[2], k_len - self.key.shape[2]
        return dataclasses.replace(
            self, query=grow(self.query, dq, 2), key=grow(self.key, dk, 2), value=grow(self.value, dk, 2),
            q_pos=plain(grow(self.q_pos, dq, 1)), k_pos=plain(grow(self.k_pos, dk, 1)),
            lengths=self.lengths or (self.query.shape[2], self.key.shape[2]))

    def problem(self) -> Problem:
        return prepare(self.bias, self.query, self.key, self.value, self.q_pos, self.k_pos, self.resolved_mask(),
                       self.scaling)


@dataclass
class Problem:
    """What a fused backend runs: (possibly extended) q, k, v, an index-space mask over their key axis
    and an optional index-space fp32 bias `bias_mod(b, h, q_row, key_slot)`."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: Mask
    bias_mod: BiasMod | None = None
    by_distance: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # bias(head, q_pos - k_pos)
    positions: tuple[torch.Tensor, torch.Tensor] | None = None  # (q_pos, k_pos) the bias is evaluated at
    materialised: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # the module's (B, H, q, k) forward


def _no_term(bias: Any, query, key, value, q_pos, k_pos, mask: Mask, scaling: float) -> Problem:
    return Problem(query, key, value, mask)


def _elementwise(bias: Any, query, key, value, q_pos, k_pos, mask: Mask, scaling: float) -> Problem:
    def bias_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return bias.score(h, q_pos[b, q], k_pos[b, kv])

    return Problem(query, key, value, mask, bias_mod, getattr(bias, "by_distance", None), (q_pos, k_pos), bias)


def _low_rank(bias: Any, query, key, value, q_pos, k_pos, mask: Mask, scaling: float) -> Problem:
    q_f, k_f = bias.factors(q_pos, k_pos)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)  # the factors differ per query head
    value = value.repeat_interleave(groups, dim=1)
    query = torch.cat((query, (q_f / scaling).to(query.dtype)), dim=-1)  # the kernel multiplies by scaling
    return Problem(query, torch.cat((key, k_f.to(key.dtype)), dim=-1), value, mask)


def _two_rotations(bias: Any, query, key, value, q_pos, k_pos, mask: Mask, scaling: float) -> Problem:
    (q_near, k_near), (q_far, k_far) = bias.rotated_pair(query, key, q_pos, k_pos)
    k_len, dim = key.shape[2], key.shape[-1]
    half = k_len + (-k_len % BLOCK)  # the second copy starts on a block edge: no block mixes copies

    def to_edge(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, 0, 0, half - k_len))  # empty slots, masked

    key = torch.cat((F.pad(to_edge(k_near), (0, dim)), F.pad(k_far, (dim, 0))), dim=2).to(query.dtype)
    value = torch.cat((to_edge(value), value), dim=2)
    query = torch.cat((q_near, q_far), dim=-1).to(query.dtype)
    return Problem(query, key, value, TwoCopyMask(mask, bias, q_pos, k_pos, half))


class TwoCopyMask(Mask):
    """The base mask on both key copies: the first copy where `bias.near`, the second elsewhere.
    `near` must be monotone (closer is near), so block bounds of the positions classify blocks."""

    def __init__(self, base: Mask, bias: Any, q_pos: torch.Tensor, k_pos: torch.Tensor, half: int) -> None:
        self.base, self.bias, self.q_pos, self.k_pos = base, bias, q_pos, k_pos
        self.half = torch.tensor(half, device=base.device)
        self.last_slot = torch.tensor(base.k_len - 1, device=base.device)
        super().__init__(self._mod, base.batch, base.q_len, half + base.k_len, base.device)

    def _mod(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        second = kv >= self.half
        slot = kv - second * self.half
        real = slot <= self.last_slot
        slot = torch.minimum(slot, self.last_slot)
        near = self.bias.near(self.q_pos[b, q], self.k_pos[b, slot])
        return real & self.base.mask_mod(b, h, q, slot) & (near != second)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        full, empty = self.base.blocks()
        q_lo, q_hi = block_ranges(self.q_pos)
        k_lo, k_hi = block_ranges(self.k_pos)
        all_near = self.bias.near(q_hi[:, :, None], k_lo[:, None, :])
        none_near = ~self.bias.near(q_lo[:, :, None], k_hi[:, None, :])
        full = torch.cat((full & all_near, full & none_near), -1)
        empty = torch.cat((empty | none_near, empty | all_near), -1)
        return tails_partial(full, self.q_len, self.k_len), empty


def _transformed(bias: Any, query, key, value, q_pos, k_pos, mask: Mask, scaling: float) -> Problem:
    groups = query.shape[1] // key.shape[1]
    query, key = bias.transformed(query, key.repeat_interleave(groups, dim=1), q_pos, k_pos)
    return Problem(query, key, value.repeat_interleave(groups, dim=1).float(), mask)


# kind (the method a term's module offers; None: no term) -> how to lay it out for a fused kernel
KINDS: dict[str | None, Callable[..., Problem]] = {
    None: _no_term, "score": _elementwise, "factors": _low_rank, "rotated_pair": _two_rotations,
    "transformed": _transformed}
LOGIT_KINDS = ("rotated_pair", "transformed")  # the module's forward gives the q.k logits, not a bias


def kind_of(bias: Any) -> str | None:
    if bias is None:
        return None
    for name in KINDS:
        if name is not None and hasattr(bias, name):
            return name
    offered = ", ".join(name for name in KINDS if name)
    raise PosEncError(f"{type(bias).__name__} offers none of {offered}: not a position term fused attention can run")


def prepare(bias: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_pos: torch.Tensor,
            k_pos: torch.Tensor, mask: Mask, scaling: float) -> Problem:
    return KINDS[kind_of(bias)](bias, query, key, value, q_pos, k_pos, mask, scaling)


def dense_logits(bias: Any, query: torch.Tensor, key: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                 scaling: float) -> torch.Tensor:
    """(B, H, q, k) fp32 logits, materialised the way the scheme's module computes them (keys already
    repeated to the query heads)."""
    if kind_of(bias) in LOGIT_KINDS:
        return bias(query, key, q_pos, k_pos).float() * scaling
    logits = (query.float() @ key.float().transpose(-1, -2)) * scaling
    return logits if bias is None else logits + bias(q_pos, k_pos)


def pad_value(problem: Problem) -> tuple[torch.Tensor, int]:
    """Value padded to the q/k width (fused sdpa kernels need one head dim), and the width to keep."""
    width = problem.value.shape[-1]
    extra = problem.query.shape[-1] - width
    return (F.pad(problem.value, (0, extra)) if extra > 0 else problem.value), width
