"""transformers' caches: the argument and output names a cache goes by, its length, the static layers' slots, and
the record of the positions of the keys a cache holds (a cache attribute that follows what generation does to
the cache's rows)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import torch
from transformers.cache_utils import Cache, StaticLayer, StaticSlidingWindowLayer

# The cache attribute that holds the positions (B, T) of every token a cache has stored, in the order they were
# written. Not a layer of the cache: `len(cache)` is the number of the model's layers (transformers asserts it).
RECORD_ATTR = "posenc_positions"
# What generation does to a cache's rows, done to the record too (`FollowRows`): cache method -> the same on (B, T)
ROW_OPS: dict[str, Callable[..., torch.Tensor]] = {
    "reorder_cache": lambda record, beam_idx: record.index_select(0, beam_idx.to(record.device)),
    "batch_select_indices": lambda record, indices: record[indices.to(record.device)],
    "batch_repeat_interleave": lambda record, repeats: record.repeat_interleave(repeats, dim=0),
}


class FollowRows:
    """A cache's own row method (`name` in ROW_OPS), set on the cache that carries a position record, that
    then does the same to the record: beam search reorders rows that hold different positions."""

    def __init__(self, cache: Any, name: str) -> None:
        self.cache, self.name = cache, name

    def __call__(self, rows: Any) -> Any:
        result = getattr(type(self.cache), self.name)(self.cache, rows)
        record = getattr(self.cache, RECORD_ATTR, None)
        if record is not None:
            setattr(self.cache, RECORD_ATTR, ROW_OPS[self.name](record, rows))
        return result


def _self_attention(cache: Any) -> Any:
    """The cache of self-attention keys (an EncoderDecoderCache also holds cross-attention keys)."""
    return getattr(cache, "self_attention_cache", cache)


# transformers 5.24 renamed the `past_key_values` argument and output field to `cache` (the old name is
# mapped to the new one until 5.40); whichever a call or an output carries is the cache.
CACHE_NAMES = ("cache", "past_key_values")


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name under which `model`'s forward takes a cache on the installed transformers."""
    return next((n for n in CACHE_NAMES if n in inspect.signature(model.forward).parameters), CACHE_NAMES[-1])


def cache_in(kwargs: dict[str, Any]) -> Any:
    """The cache a forward was given, under either name."""
    return next((kwargs[name] for name in CACHE_NAMES if kwargs.get(name) is not None), None)


def cache_out(output: Any) -> Any:
    """The cache a model output carries, under whichever name is one of its fields (5.24's outputs answer to the
    old name too, through a property that logs a deprecation: it is never read where `cache` is a field)."""
    fields = {f.name for f in dataclasses.fields(output)} if dataclasses.is_dataclass(output) else set(CACHE_NAMES)
    return next((getattr(output, name) for name in CACHE_NAMES if name in fields and getattr(output, name, None)
                 is not None), None)


def cache_length(cache: Any) -> int:
    """Tokens a cache has stored so far (0 for none)."""
    return int(cache.get_seq_length()) if isinstance(cache, Cache) else 0


def static_slots(cache: Any) -> int | None:
    """The slots of a static cache (every self-attention layer a full-length `StaticLayer`): the keys each layer
    holds, used or not, as `torch.compile` sees them; None for any other cache (dynamic, sliding, none)."""
    layers = getattr(_self_attention(cache), "layers", None) if isinstance(cache, Cache) else None
    if not layers or not all(isinstance(layer, StaticLayer) and not isinstance(layer, StaticSlidingWindowLayer)
                             for layer in layers):
        return None
    return layers[0].max_cache_len


def static_length(cache: Any, device: torch.device) -> torch.Tensor:
    """Tokens a static cache holds, as the 0-d tensor its layers count them in (no `.item()`: under
    `torch.compile` the count is data, and reading it as a number guards on it and recompiles every step)."""
    layer = _self_attention(cache).layers[0]
    if not layer.is_initialized:
        return torch.zeros((), dtype=torch.long, device=device)
    # later 5.x count what they wrote; 5.0 counts the slots holding a non-zero key, also as a tensor
    length = getattr(layer, "cumulative_length", None)
    return (length if length is not None else torch.as_tensor(layer.get_seq_length())).to(device)


def static_record(cache: Any, batch: int, slots: int) -> torch.Tensor | None:
    """(batch, slots) positions of the keys in every slot of a static cache, if it carries a record of them (the
    slots not written yet hold anything: the mask hides them)."""
    record = getattr(_self_attention(cache), RECORD_ATTR, None)
    return record if record is not None and tuple(record.shape) == (batch, slots) else None


def recorded_positions(cache: Any, batch: int) -> torch.Tensor | None:
    """(batch, T) positions of the T tokens in `cache`, if it carries a record of them. Rows follow the cache's
    (`FollowRows`); a cache cropped (assisted decoding) or reset since keeps the record's first T, or none."""
    if torch.compiler.is_compiling():  # its checks read the cache's length, data under a static cache
        return None
    record = getattr(_self_attention(cache), RECORD_ATTR, None) if isinstance(cache, Cache) else None
    length = cache_length(cache)
    if record is None or length == 0 or record.shape[-1] < length or record.shape[0] != batch:
        return None
    return record[:, :length]


def record_positions(cache: Any, positions: torch.Tensor) -> None:
    """Make `positions` (B, T) the record of the T tokens `cache` now holds; of a static cache, (B, slots): every
    slot's, written and read without reading the cache's length as a number, so that compiled decoding steps
    (fullgraph, static shapes) keep it too. Other compiled forwards neither write nor read it."""
    if (slots := static_slots(cache)) is not None:  # the positions of every slot, as `positions_of` made them
        if positions.shape[-1] != slots:
            return
        cache = _self_attention(cache)
        record = getattr(cache, RECORD_ATTR, None)
        if torch.compiler.is_compiling() and record is not None and record.shape == positions.shape \
                and record.dtype == positions.dtype:
            record.copy_(positions)  # in place: no new attribute per compiled step
            return
    elif torch.compiler.is_compiling() or not isinstance(cache, Cache) or positions.shape[-1] != cache_length(cache):
        return
    cache = _self_attention(cache)
    setattr(cache, RECORD_ATTR, positions)
    if torch.compiler.is_compiling():  # rows follow from the eager prefill on
        return
    for name in ROW_OPS:
        if not isinstance(vars(cache).get(name), FollowRows):
            setattr(cache, name, FollowRows(cache, name))
