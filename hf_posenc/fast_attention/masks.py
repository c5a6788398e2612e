"""Which scores attention may use, without an (L, L) tensor.

A mask here is index-space, FlexAttention's and transformers' convention: `mask_mod(batch, head,
query row, key slot) -> allowed`, written so it also broadcasts over index tensors (the chunked and
dense paths evaluate it for a block of rows). Next to it each mask classifies (128 x 128) blocks as
full, empty or partial (FlexAttention's BlockMask, built in O((L/128)^2)), and names the key span a
block of rows can see (the chunked path skips the rest). `MaskSpec` does both from O(L) data; any
other mask is evaluated row block by row block.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import _DEFAULT_SPARSE_BLOCK_SIZE, BlockMask

from ..errors import PosEncError

BLOCK = _DEFAULT_SPARSE_BLOCK_SIZE  # FlexAttention's sparse block (128)
NO_WINDOW = 2**62
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(eq=False)
class MaskSpec:
    """An attention pattern described by O(L) data. Key slots are the layer's keys in order; query row
    i sits at slot `q_offset + i` (default k - q: the queries are the last keys, as in a prefill or a
    cached decode step; a static cache passes its cache position).

    Args:
        causal: a query sees no slot after its own.
        sliding_window: causal: slots > own slot - window; bidirectional: |slot distance| <= window
            (transformers' conventions).
        key_padding: (B, k) bool, False where a slot holds no token (padding, unused static-cache slots).
        documents: (B, k) document id of each slot (packed rows): attention stays inside a document.
        q_offset: int or (B,) tensor, the slot of query row 0.
    """

    causal: bool = True
    sliding_window: int | None = None
    key_padding: torch.Tensor | None = None
    documents: torch.Tensor | None = None
    q_offset: int | torch.Tensor | None = None
    _block_masks: dict[Any, BlockMask] = field(default_factory=dict, init=False, repr=False)

    def resolve(self, batch: int, q_len: int, k_len: int, device: torch.device,
                padded_to: tuple[int, int] | None = None) -> "SpecMask":
        return SpecMask(self, batch, q_len, k_len, device, padded_to)


def plain(x: torch.Tensor) -> torch.Tensor:
    """A fresh, standard-strided copy. Tensors a flex kernel captures must be: the CPU template fails
    to lower an expanded (stride-0) view, even of size 1."""
    return x.clone(memory_format=torch.contiguous_format)


def block_ranges(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block (min, max) along the last dim of (B, n); the tail block repeats the last value."""
    pad = -x.shape[-1] % BLOCK
    x = torch.cat((x, x[:, -1:].expand(-1, pad)), dim=-1).unflatten(-1, (-1, BLOCK))
    return x.amin(-1), x.amax(-1)


def tails_partial(full: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """Blocks that overhang the sequence are never 'full' (as in torch's create_block_mask)."""
    full = full.clone()
    if q_len % BLOCK:
        full[:, -1, :] = False
    if k_len % BLOCK:
        full[:, :, -1] = False
    return full


def index_grid(batch: int, rows: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(b, h, q, kv) index tensors shaped to broadcast to (B, 1, rows, keys)."""
    b = torch.arange(batch, device=rows.device)[:, None, None, None]
    return b, torch.zeros_like(b[:1]), rows[None, None, :, None], keys[None, None, None, :]


class Mask:
    """A resolved mask for one (B, q, k) problem. Its BlockMask is kept in `cache` (the MaskSpec's, or
    one per mask function) under `key`, so the layers of one forward build it once."""

    def __init__(self, mask_mod: MaskMod, batch: int, q_len: int, k_len: int, device: torch.device,
                 cache: dict[Any, BlockMask] | None = None, key: Any = None) -> None:
        self.mask_mod, self.batch, self.q_len, self.k_len, self.device = mask_mod, batch, q_len, k_len, device
        self._cache, self._key = ({} if cache is None else cache), (key, batch, q_len, k_len, str(device))

    def dense(self, r0: int, r1: int, k0: int = 0, k1: int | None = None) -> torch.Tensor:
        """(B, 1, r1 - r0, k1 - k0) bool for query rows [r0, r1) and key slots [k0, k1)."""
        k1 = self.k_len if k1 is None else k1
        rows = torch.arange(r0, r1, device=self.device)
        grid = index_grid(self.batch, rows, torch.arange(k0, k1, device=self.device))
        return self.mask_mod(*grid).expand(self.batch, 1, r1 - r0, k1 - k0)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(full, empty) bool (B, q blocks, k blocks), evaluated one row block at a time."""
        full, empty = [], []
        for r0 in range(0, self.q_len, BLOCK):
            allowed = self.dense(r0, min(r0 + BLOCK, self.q_len))[:, 0]
            allowed = F.pad(allowed, (0, -self.k_len % BLOCK)).unflatten(-1, (-1, BLOCK))
            full.append(allowed.all(-1).all(-2))
            empty.append(~allowed.any(-1).any(-2))
        return tails_partial(torch.stack(full, 1), self.q_len, self.k_len), torch.stack(empty, 1)

    def key_span(self, r0: int, r1: int) -> tuple[int, int]:
        """Key slots [lo, hi) outside which rows [r0, r1) see nothing."""
        return 0, self.k_len

    def block_mask(self) -> BlockMask:
        if self._key not in self._cache:
            self._cache[self._key] = to_block_mask(*self.blocks(), self.mask_mod, self.q_len, self.k_len)
        return self._cache[self._key]


class SpecMask(Mask):
    """A `MaskSpec` resolved: tensors for every field (one mask_mod code, so one compiled kernel
    serves padded, packed and windowed inputs alike), blocks from per-block index ranges."""

    def __init__(self, spec: MaskSpec, batch: int, q_len: int, k_len: int, device: torch.device,
                 padded_to: tuple[int, int] | None = None) -> None:
        self.spec = spec
        offset = k_len - q_len if spec.q_offset is None else spec.q_offset
        q_size, k_size = padded_to or (q_len, k_len)
        self.offset = plain(torch.as_tensor(offset, device=device).to(torch.long).expand(batch))
        self.window = torch.tensor(spec.sliding_window or NO_WINDOW, device=device)
        padding, docs = spec.key_padding, spec.documents
        for name, tensor in (("key_padding", padding), ("documents", docs)):
            if tensor is not None and tensor.shape[-1] != k_len:
                raise PosEncError(f"MaskSpec.{name} covers {tensor.shape[-1]} key slots, the layer holds {k_len}")
        padding = torch.ones(batch, k_len, dtype=torch.bool, device=device) if padding is None else padding
        docs = torch.zeros(batch, k_len, dtype=torch.long, device=device) if docs is None else docs
        # Slots past the real keys (a kernel's padded length) hold nothing.
        self.padding = plain(F.pad(padding.to(device, torch.bool).expand(batch, -1), (0, k_size - k_len), value=False))
        self.docs = plain(F.pad(docs.to(device, torch.long).expand(batch, -1), (0, k_size - k_len), value=-1))
        self.last_slot = torch.tensor(k_size - 1, device=device)
        self._grown = (q_size, k_size) != (q_len, k_len)
        self._offset_bounds: tuple[int, int] | None = None
        mask_mod = self._causal_mod if spec.causal else self._bidirectional_mod
        super().__init__(mask_mod, batch, q_size, k_size, device, cache=spec._block_masks, key=(q_len, k_len))

    def _shared(self, b: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slot = q + self.offset[b]
        same_doc = self.docs[b, kv] == self.docs[b, torch.minimum(slot, self.last_slot)]
        return slot - kv, self.padding[b, kv] & same_doc

    def _causal_mod(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        distance, keep = self._shared(b, q, kv)
        return keep & (distance >= 0) & (distance < self.window)

    def _bidirectional_mod(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        distance, keep = self._shared(b, q, kv)
        return keep & (distance.abs() <= self.window)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        slots = torch.arange(self.q_len, device=self.device)[None] + self.offset[:, None]
        slot_lo, slot_hi = block_ranges(slots)
        kv_lo, kv_hi = block_ranges(torch.arange(self.k_len, device=self.device)[None])
        d_min = slot_lo[:, :, None] - kv_hi[:, None, :]
        d_max = slot_hi[:, :, None] - kv_lo[:, None, :]
        if self.spec.causal:
            full, empty = (d_min >= 0) & (d_max < self.window), (d_max < 0) | (d_min >= self.window)
        else:
            full, empty = (d_min >= -self.window) & (d_max <= self.window), (d_min > self.window) | (d_max < -self.window)
        pad_lo, pad_hi = block_ranges(self.padding.to(torch.int8))
        q_docs = block_ranges(self.docs.gather(1, slots.clamp(max=self.k_len - 1)))
        k_docs = block_ranges(self.docs)
        one_doc = (q_docs[0] == q_docs[1])[:, :, None] & (k_docs[0] == k_docs[1])[:, None, :]
        full = full & (pad_lo == 1)[:, None, :] & one_doc & (q_docs[0][:, :, None] == k_docs[0][:, None, :])
        empty = empty | (pad_hi == 0)[:, None, :]
        empty = empty | (q_docs[1][:, :, None] < k_docs[0][:, None, :]) | (k_docs[1][:, None, :] < q_docs[0][:, :, None])
        return tails_partial(full, self.q_len, self.k_len), empty

    def offset_bounds(self) -> tuple[int, int]:
        if self._offset_bounds is None:
            self._offset_bounds = int(self.offset.min()), int(self.offset.max())
        return self._offset_bounds

    def band(self) -> tuple[int, int | None, bool] | None:
        """(slot of query row 0, sliding window, causal) when whether a score is allowed depends on the
        slot distance alone and every row sees its own slot (no padding, documents or padded slots,
        one offset for the batch); else None."""
        if (self.spec.key_padding is not None or self.spec.documents is not None or self._grown
                or torch.compiler.is_compiling()):
            return None
        low, high = self.offset_bounds()
        if low != high or low < 0 or low + self.q_len > self.k_len:
            return None
        return low, self.spec.sliding_window, self.spec.causal

    def key_span(self, r0: int, r1: int) -> tuple[int, int]:
        if torch.compiler.is_compiling():  # the bounds need the offsets as Python ints
            return 0, self.k_len
        low, high = self.offset_bounds()
        window = self.spec.sliding_window
        if self.spec.causal:
            lo = 0 if window is None else low + r0 - window + 1
            hi = high + r1
        else:
            lo, hi = (0, self.k_len) if window is None else (low + r0 - window, high + r1 + window)
        return max(lo, 0), min(hi, self.k_len)


def to_block_mask(full: torch.Tensor, empty: torch.Tensor, mask_mod: MaskMod, q_len: int, k_len: int) -> BlockMask:
    """FlexAttention's BlockMask from (B, q blocks, k blocks) full/empty classifications."""

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = dense.sum(-1, dtype=torch.int32)
        indices = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[:, None], indices[:, None]

    partial = ~full & ~empty
    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(q_len, k_len))


# A mask function's BlockMask, kept while the function lives (transformers makes one per forward).
_FUNCTION_BLOCK_MASKS: weakref.WeakKeyDictionary[Callable, dict[Any, BlockMask]] = weakref.WeakKeyDictionary()


def resolve(mask: Any, batch: int, q_len: int, k_len: int, device: torch.device,
            padded_to: tuple[int, int] | None = None) -> Mask:
    """Any accepted mask as a `Mask`: a MaskSpec, an index-space mask_mod, a BlockMask, a 4-D bool
    tensor or a 4-D float one holding only 0 and -inf/min (transformers' forms), or None (no mask).
    `padded_to`: (q, k) lengths of padded inputs; padded rows and slots are masked."""
    if mask is None:
        mask = MaskSpec(causal=False)
    if isinstance(mask, MaskSpec):
        return mask.resolve(batch, q_len, k_len, device, padded_to)
    cache: dict[Any, BlockMask] = {}
    if isinstance(mask, BlockMask):
        if tuple(mask.seq_lengths) != (q_len, k_len):
            raise PosEncError(f"BlockMask is for {tuple(mask.seq_lengths)} (queries, keys), the inputs are {(q_len, k_len)}")
        mask_mod = mask.mask_mod
        cache[((q_len, k_len), batch, q_len, k_len, str(device))] = mask
    elif isinstance(mask, torch.Tensor):
        mask_mod = _tensor_mod(mask, batch, q_len, k_len)
    elif callable(mask):
        mask_mod, cache = mask, _FUNCTION_BLOCK_MASKS.setdefault(mask, {})
    else:
        raise PosEncError(f"mask must be a MaskSpec, a mask_mod, a BlockMask, a 4-D tensor or None, got {type(mask).__name__}")
    if padded_to is None or padded_to == (q_len, k_len):
        return Mask(mask_mod, batch, q_len, k_len, device, cache, key=(q_len, k_len))
    last_row, last_slot = torch.tensor(q_len - 1, device=device), torch.tensor(k_len - 1, device=device)

    def padded_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        inside = (q <= last_row) & (kv <= last_slot)
        return inside & mask_mod(b, h, torch.minimum(q, last_row), torch.minimum(kv, last_slot))

    return Mask(padded_mod, batch, *padded_to, device, cache, key=(q_len, k_len))


def _tensor_mod(mask: torch.Tensor, batch: int, q_len: int, k_len: int) -> MaskMod:
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-2] != q_len or mask.shape[-1] < k_len:
        raise PosEncError(f"a 4-D mask must be (B, 1, {q_len}, >= {k_len}), got {tuple(mask.shape)}")
    mask = mask[..., :k_len]
    if mask.dtype != torch.bool:
        allowed, blocked = mask == 0, mask <= torch.finfo(mask.dtype).min / 2
        if not bool((allowed | blocked).all()):
            raise PosEncError("a float 4-D mask may hold only 0 (attend) and -inf or the dtype's min (masked); "
                              "pass additive biases as a bias, not inside the mask")
        mask = allowed
    if mask.shape[0] == 1:
        return lambda b, h, q, kv: mask[0, 0, q, kv]
    return lambda b, h, q, kv: mask[b, 0, q, kv]
