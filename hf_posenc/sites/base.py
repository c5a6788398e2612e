"""What the site installers share: the layer-loop hook that computes positions once per forward, and
taking away the model's own positions.

Every hook a patch registers is a small object of a module-level class (plain data, so `deepcopy` and
`torch.save` copy it with the model) that finds the modules it uses through the model when it is called
(so peft's wrappers and merges are what runs); unpatch removes every hook of these classes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import PretrainedConfig

from .. import compat
from ..attention import BASES, POSITIONS_KWARG, PREFIX, Positions, PositionedConfig, implementation_for
from ..errors import PosEncError
from ..schemes.base import ZeroBuckets, ZeroPositions
from ..schemes.building import built
from ..schemes.rotary import Rotary

if TYPE_CHECKING:
    from ..state import PatchState
    from .entry import Entry


class PatchHook:
    """Base of every hook a patch registers (unpatch removes them by this type)."""


def remove_hooks(root: nn.Module, kind: type = PatchHook) -> None:
    """Remove every forward (pre-)hook of type `kind` from `root` and its submodules, wherever a wrapper
    has put the module since: the undo of all hooks, kept as data (a handle would point at one module)."""
    for module in root.modules():
        for hooks, extras in ((module._forward_pre_hooks, (module._forward_pre_hooks_with_kwargs,)),
                              (module._forward_hooks, (module._forward_hooks_with_kwargs,
                                                       module._forward_hooks_always_called))):
            for key in [key for key, hook in hooks.items() if isinstance(hook, kind)]:
                del hooks[key]
                for extra in extras:
                    extra.pop(key, None)


def positions_of(kwargs: dict[str, Any], offset: int) -> Positions:
    """The one source of positions for a forward of the layer loop.

    Queries: explicit `position_ids` (minus RoBERTa's offset; OPT's slot adds its own), else counted over
    the 2-D padding mask (so a left-padded row sees the positions of the prompt alone), else continuing the
    cache. Keys: the positions cached keys were written at, recorded in the cache
    (`compat.record_positions`), then the queries; a cache filled outside this patch falls back to the mask
    count, else 0, 1, 2, ...
    """
    ids = kwargs.get("input_ids")
    ref = ids if ids is not None else kwargs["inputs_embeds"][..., 0]
    # multiple-choice inputs (batch, choices, seq) are rows of their own once the model flattens them
    rows = ref.dim() - 1
    ref, mask, explicit = (_flat(t, rows) for t in (ref, kwargs.get("attention_mask"), kwargs.get("position_ids")))
    batch, length = ref.shape
    cache = compat.cache_in(kwargs)
    counted = None
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:  # not a prepared 4-D mask or a per-layer-type dict
        counted = (mask.long().cumsum(-1) - 1).clamp(min=0)
    if (slots := compat.static_slots(cache)) is not None:
        return _static_positions(cache, slots, explicit, counted, offset, batch, length, ref.device)
    past = compat.cache_length(cache)
    if explicit is not None:
        queries = (explicit - offset).expand(batch, -1)
    elif counted is not None:
        # this call's columns: the mask covers past and new tokens (BLOOM's generate pads it on the right
        # to a static cache's length, so they are not always the last ones)
        end = min(past + length, counted.shape[-1])
        queries = counted[:, end - length:end]
    else:
        queries = (torch.arange(length, device=ref.device) + past).expand(batch, -1)
    if not past:
        return Positions(queries, queries, [])
    earlier = compat.recorded_positions(cache, batch)
    if earlier is None:
        if counted is not None and counted.shape[-1] >= past + length:
            earlier = counted[:, :past]
        else:
            earlier = torch.arange(past, device=ref.device).expand(batch, -1)
    return Positions(queries, torch.cat((earlier.to(queries.device), queries), dim=-1), [])


def _static_positions(cache: Any, slots: int, explicit: torch.Tensor | None, counted: torch.Tensor | None,
                      offset: int, batch: int, length: int, device: torch.device) -> Positions:
    """`positions_of` for a static cache, branch-free on its contents (compiled decoding: one graph for every
    step): the queries' as above, and the keys' of every slot the layers hold, used or not (the mask hides the
    unused), with this call's written at the slots the cache writes its keys to. The cache's length stays a
    tensor, and a 2-D mask is read at a static width (as transformers pads it to the cache's length)."""
    past = compat.static_length(cache, device)
    written = past + torch.arange(length, device=device)  # this call's slots
    if counted is not None:  # at the static width; columns past the mask hold 0 (nothing reads them)
        counted = nn.functional.pad(counted, (0, slots - counted.shape[-1])) if counted.shape[-1] < slots \
            else counted[:, :slots]
    if explicit is not None:
        queries = (explicit - offset).expand(batch, -1)
    elif counted is not None:
        queries = counted.gather(-1, written.clamp(max=slots - 1).expand(batch, -1))
    else:
        queries = written.expand(batch, -1)
    earlier = compat.static_record(cache, batch, slots)
    if earlier is None:  # a fresh cache, or one filled outside this patch: counted over the mask, else 0, 1, 2, ...
        slot = torch.arange(slots, device=device)
        earlier = counted if counted is not None else slot.expand(batch, -1)
        earlier = torch.where(slot < past, earlier, 0)  # unused slots at 0 (a far position can overflow xPos's decay)
    dtype = torch.promote_types(earlier.dtype, queries.dtype)  # fractional position_ids stay fractional
    keys = earlier.to(queries.device, dtype).index_copy(1, written.to(queries.device), queries.to(dtype))
    return Positions(queries, keys, [])


def _flat(tensor: Any, rows: int) -> Any:
    """`tensor` with its `rows` leading dimensions as one, where it has exactly those and a sequence (ids, a 2-D
    padding mask or position ids of multiple-choice inputs); anything else as it is."""
    if rows > 1 and isinstance(tensor, torch.Tensor) and tensor.dim() == rows + 1:
        return tensor.reshape(-1, tensor.shape[-1])
    return tensor


@dataclasses.dataclass(eq=False)
class LayerLoop(PatchHook):
    """Forward pre-hook on the module owning the layer loop. Once per forward it computes the positions,
    fills in padding-aware `position_ids` for a position slot called with them (`slot`), and lets each site
    add what its modules need as private kwargs (`contributions`, which get the loop owner and find their
    modules on it), which transformers passes down to the attention modules and functions. Positions never
    travel down as `position_ids` where the model would not have had them: ids that do not step by one with
    no mask and no cache are read by transformers as packed sequences. Plain data, as every patch hook."""

    scheme: str
    arg_names: list[str]
    offset: int
    slot: bool
    token_type_ids: bool
    carry: str | None = None  # path of the blocks whose `CarryKwargs` hooks take the private kwargs (BLOOM, Falcon)
    contributions: list[Any] = dataclasses.field(default_factory=list)  # callables (loop owner, kwargs, positions)
    key_positions: bool = False  # attention needs the keys' positions (score and attention sites)
    posenc_attention: bool = False  # the scheme runs inside a posenc_* attention implementation
    handed: torch.Tensor | None = None  # position_ids the wrapper's forward drops (KeepPositionIds)

    def __call__(self, owner: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        kwargs = {**dict(zip(self.arg_names, args)), **kwargs}
        if self.posenc_attention and compat.attn_implementation(owner.config) not in BASES:
            raise PosEncError(
                f"attention implementation was switched to {compat.attn_implementation(owner.config)!r} after "
                f"patching, which cannot take the {self.scheme!r} scheme's term; set it back with "
                f"model.set_attn_implementation({' or '.join(map(repr, BASES))})"
            )
        handed, self.handed = self.handed, None
        explicit = {"position_ids": handed} if handed is not None and kwargs.get("position_ids") is None else {}
        positions = positions_of({**kwargs, **explicit}, self.offset)
        if self.slot and kwargs.get("position_ids") is None:
            kwargs["position_ids"] = positions.queries + self.offset
        if self.token_type_ids and kwargs.get("token_type_ids") is None:
            # The stock zero buffer is indexed by position and would overflow past the old table.
            kwargs["token_type_ids"] = torch.zeros_like(positions.queries)
        for contribution in self.contributions:
            contribution(owner, kwargs, positions)
        if self.key_positions:
            kwargs[POSITIONS_KWARG] = positions
        if self.carry:
            private = {k: v for k, v in kwargs.items() if k.startswith(PREFIX)}
            for block in owner.get_submodule(self.carry):
                for hook in block._forward_pre_hooks.values():
                    if isinstance(hook, CarryKwargs):
                        hook.private = private
        return (), kwargs


class KeepPositionIds(PatchHook):
    """Forward pre-hook on a model whose forward drops `position_ids` on the way to a base model that takes
    none (BLOOM's causal LM hands its **kwargs to the loss): they go to this forward's `LayerLoop`, on the
    module at `loop` from the base model ("": the base model)."""

    def __init__(self, loop: str) -> None:
        self.loop = loop

    def __call__(self, model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        kwargs = dict(kwargs)
        handed = kwargs.pop("position_ids", None)
        for hook in model.base_model.get_submodule(self.loop)._forward_pre_hooks.values():
            if isinstance(hook, LayerLoop):
                hook.handed = handed
        return args, kwargs


class RecordPositions(PatchHook):
    """Forward hook on the module owning the layer loop: the positions of every key the cache now holds
    go into the cache, where they follow beam reordering, cropping and batch selection."""

    def __call__(self, owner: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        positions = kwargs.get(POSITIONS_KWARG)
        if positions is None:
            return
        cache = compat.cache_out(output)
        compat.record_positions(cache if cache is not None else compat.cache_in(kwargs), positions.keys)


class RelayKwargs(PatchHook):
    """Forward pre-hook on a block that takes **kwargs but does not hand them to its attention module
    (StableLM, Nemotron): the patch's private kwargs go to the attention module's `InjectKwargs` instead."""

    def __init__(self, attention: str) -> None:
        self.attention = attention

    def __call__(self, block: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        private = {k: kwargs.pop(k) for k in [k for k in kwargs if k.startswith(PREFIX)]}
        inject(block.get_submodule(self.attention), private)
        return args, kwargs


class CarryKwargs(PatchHook):
    """Forward pre-hook on a block its layer loop calls without **kwargs (BLOOM, Falcon): hands the private
    kwargs the `LayerLoop` left here for this forward to the attention module's `InjectKwargs`."""

    def __init__(self, attention: str) -> None:
        self.attention = attention
        self.private: dict[str, Any] = {}

    def __call__(self, block: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        inject(block.get_submodule(self.attention), self.private)


def inject(attention: nn.Module, private: dict[str, Any]) -> None:
    """Leave `private` for the next call of `attention` with its `InjectKwargs` hook (added on first use,
    or when a wrapper put a new module there)."""
    hook = next((h for h in attention._forward_pre_hooks.values() if isinstance(h, InjectKwargs)), None)
    if hook is None:
        hook = InjectKwargs()
        attention.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)
    hook.pending = private


class InjectKwargs(PatchHook):
    """Forward pre-hook on an attention module: adds the private kwargs its block's `RelayKwargs` or
    `CarryKwargs` left here (before any other patch hook reads them). They stay until the block's next call:
    gradient checkpointing recomputes the block's forward in backward without running the block's hooks."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] = {}

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        return args, {**kwargs, **self.pending}


class SlotIds(PatchHook):
    """Forward pre-hook on a position slot the model calls with arguments of its own (OPT: the mask, the
    past length and `position_ids=`; BART: `input_ids` and the past length): whatever the call, the slot
    gets `slot(ids)`, the table rows `HandSlotIds` computed for this forward from the loop's positions."""

    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None

    def __call__(self, slot: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        ids, self.pending = self.pending, None
        if ids is None:
            raise PosEncError("position ids missing: a patched position slot was called outside its layer loop "
                              "(or twice in one forward)")
        return (ids,), {}


class HandSlotIds:
    """Contribution: the query positions as rows of the slot at `path` (from the loop owner), left on the
    slot's `SlotIds` hook for its next call."""

    def __init__(self, path: str, offset: int) -> None:
        self.path, self.offset = path, offset

    def __call__(self, owner: nn.Module, kwargs: dict[str, Any], positions: Positions) -> None:
        slot = owner.get_submodule(self.path)
        hook = next((h for h in slot._forward_pre_hooks.values() if isinstance(h, SlotIds)), None)
        if hook is None:  # first call, or a wrapper put a new module there
            hook = SlotIds()
            slot.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)
        hook.pending = positions.queries + self.offset


class ZeroBias(PatchHook):
    """Forward pre-hook on a block: the model's own score bias, handed to each block as the keyword argument
    `argument` (BLOOM's `alibi`, MPT's `position_bias`), becomes zeros."""

    def __init__(self, argument: str) -> None:
        self.argument = argument

    def __call__(self, block: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        bias = kwargs.get(self.argument)
        if not isinstance(bias, torch.Tensor):
            raise PosEncError(f"{type(block).__name__} was called without `{self.argument}` as a keyword tensor; "
                              "its own position bias cannot be switched off")
        return args, {**kwargs, self.argument: torch.zeros_like(bias)}


class PassModule:
    """Contribution: hands the module at `path` (whatever wraps it now) to attention under `kwarg`."""

    def __init__(self, kwarg: str, path: str) -> None:
        self.kwarg, self.path = kwarg, path

    def __call__(self, owner: nn.Module, kwargs: dict[str, Any], positions: Positions) -> None:
        kwargs[self.kwarg] = owner.get_submodule(self.path)


def remove_native_positions(model: nn.Module, entry: Entry, state: PatchState, keep_slot: bool = False,
                            keep_rotary: bool = False) -> None:
    """Switch the model's own positions off: a zero in the position slot, cos=1, sin=0 from its rotary module
    (as wide as the model's own (cos, sin): partial rotaries hand out fewer than head_dim), a zero native bias
    (or a zero bucket table, whose bias T5 computes once and shares down the stack)."""
    for path, module in native_off(model, entry, state, keep_slot, keep_rotary):
        state.replace(model.base_model, path, module)


def native_off(model: nn.Module, entry: Entry, state: PatchState, keep_slot: bool = False,
               keep_rotary: bool = False) -> list[tuple[str, nn.Module]]:
    """`remove_native_positions` up to the modules that take the place of the model's own, built and returned by
    path from the base model for the caller to put in (`state.replace`) with its other changes; the native bias is
    switched off here (a recorded switch, or a hook on each block)."""
    base, adapter, facts = model.base_model, entry.adapter, entry.facts
    bias, rotation = adapter.bias, adapter.rotation
    if bias.switch:
        if not isinstance(getattr(base, bias.switch, None), bool):
            raise PosEncError(f"{type(base).__name__} has no boolean `{bias.switch}` to switch its own position bias "
                              "off")
        state.set_attr(base, bias.switch, False)
    elif bias.argument:
        for block in adapter.attention_blocks(model):
            block.register_forward_pre_hook(ZeroBias(bias.argument), with_kwargs=True)
    found: list[tuple[str, nn.Module]] = []
    if bias.table:
        shape = tuple(base.get_submodule(bias.table).weight.shape)
        found.append((bias.table, ZeroBuckets(shape, facts.dtype).to(facts.device)))
    if adapter.slot and not keep_slot and not entry.keeps_slot:
        found.append((adapter.slot.path, ZeroPositions(facts.dtype).to(facts.device)))
    if rotation and not keep_rotary:
        found.append((rotation.module, Rotary(rotation.dim or facts.head_dim, {}, 0.0, facts.max_positions,
                                              replaces=base.get_submodule(rotation.module))))
    return found


def install_biased_attention(name: str, kwarg: str, model: nn.Module, entry: Entry, state: PatchState,
                             loop: LayerLoop) -> None:
    """Score and attention sites: the scheme's module on the loop owner as `name`, handed to the posenc
    attention function as `kwarg` with the positions of queries and keys. One pass down: what takes the place of
    the model's own positions, what is read of the model, the scheme's module, then every change recorded."""
    loop.contributions.append(PassModule(kwarg, name))
    loop.key_positions = loop.posenc_attention = True
    replaced = native_off(model, entry, state)
    attentions, path = entry.adapter.attention_modules(model), entry.adapter.at_loop(name)
    for attention in attentions:
        if not isinstance(getattr(attention, "config", None), PretrainedConfig):
            raise PosEncError(f"{type(attention).__name__} reads no config to choose its attention function by; "
                              f"the {entry.spec.name!r} scheme's term has no way in")
    # flash attention takes no float term (the implementation read as `PositionedConfig` reads it)
    implementation_for(model.config._attn_implementation)
    positioned = [PositionedConfig(attention.config) for attention in attentions]  # each module's, set below
    module = built(entry.spec, entry.config.options, entry.facts)
    for where, substitute in replaced:
        state.replace(model.base_model, where, substitute)
    state.add_module(model.base_model, path, module, new=True)
    for attention, config in zip(attentions, positioned):
        state.set_attr(attention, "config", config, instance=True)
    state.set_attr(model, "set_attn_implementation", functools.partial(set_attn_implementation, model), instance=True)


def set_attn_implementation(model: nn.Module, attn_implementation: str | dict, *args: Any, **kwargs: Any) -> None:
    """`model.set_attn_implementation` once the patch runs in the posenc attention function: transformers' own,
    for the implementations that function stands in for; any other is refused at the call, the model unchanged."""
    # a name transformers does not know is refused by transformers, in its own words
    if isinstance(attn_implementation, str) and compat.known_attention(attn_implementation) \
            and attn_implementation not in BASES:
        raise PosEncError(f"attn_implementation {attn_implementation!r} cannot take the patched scheme's attention "
                          f"term; choose one of {', '.join(map(repr, BASES))}")
    type(model).set_attn_implementation(model, attn_implementation, *args, **kwargs)


def add_scheme_module(name: str, kwarg: str, model: nn.Module, entry: Entry, state: PatchState,
                      loop: LayerLoop, path: str | None = None) -> None:
    """The scheme's module on the loop owner as `name` (at `path` from the base model), handed down each forward
    as `kwarg` with the positions of queries and keys (whatever then applies it: posenc attention, or a
    `BiasMask`)."""
    loop.contributions.append(PassModule(kwarg, name))
    loop.key_positions = True
    path = path or entry.adapter.at_loop(name)
    state.add_module(model.base_model, path, built(entry.spec, entry.config.options, entry.facts), new=True)
