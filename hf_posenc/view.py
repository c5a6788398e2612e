"""The one reader of a model: its attention stacks as a patch and the questions over the registry see them, read
once per config.

A *view* has the same shape for every model: a decoder-only or encoder-only model is one stack, the model itself
(name None); an encoder-decoder model, or a speech LM, has two, "encoder" and "decoder", each read as a model of
its own, of which those that read text are what a patch takes by default. This module is the only one that knows
where an adapter comes from (the hand-written one of the model type in `adapters.base.ADAPTERS`, else the generic one
discovery reads off the model), that a config is read off its model built on the meta device, and that a patched
model is read as it was before its patch: from the stock read its patch kept (`StockRead`, on its `PatchState`),
never by taking the patch off. `read` gives the structure (cached per config and model class), `stock` the stacks of
one instance with their modules and stock facts (read per call: they hold the model's tables as they are now).
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from typing import Any, Generic, Hashable, Mapping, TypeVar

import torch
from torch import nn

from . import adapters, compat, schemes  # noqa: F401  (import registers them)
from .adapters.base import ADAPTERS, Adapter, Tables
from .adapters.discover import discover
from .adapters.generic import adapter_from, generic_adapter
from .adapters.meta import meta_model
from .config import STACKS
from .errors import PosEncError
from .schemes.base import ModelFacts
from .state import STATE_ATTR, PatchState

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Stack:
    """One attention stack as read (cached per config): its name (None: the model's one stack; else an
    encoder-decoder's "encoder" or "decoder", `config.STACKS`) and adapter. A plan's stacks are `sites.StackPlan`s."""

    name: str | None
    adapter: Adapter


@dataclasses.dataclass(frozen=True)
class StockStack:
    """One stack of an instance as its stock model has it (`stock`): its module (a config's model built on the meta
    device), its facts, and the modules its own position tables live in (which a patch takes out and keeps)."""

    name: str | None
    adapter: Adapter
    module: nn.Module
    facts: ModelFacts
    tables: Tables


@dataclasses.dataclass(frozen=True)
class ModelView:
    """A model's attention stacks. `stacks`: those read (an encoder-decoder's in `config.STACKS` order); `text`:
    the names a patch takes by default (the stacks that read text); `refused`: a stack that cannot be read -> the
    message saying why; `no_text`: why no stack reads text, where none does; `two_stacks`: an encoder-decoder
    model (or a speech LM), whose stacks are named. A record, not a cache: what is asked of it
    (`sites.stacks_refusal`) is answered from it, not kept in it."""

    model_type: str
    stacks: tuple[Stack, ...]
    text: tuple[str | None, ...]
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)
    no_text: str | None = None
    two_stacks: bool = False

    @property
    def native(self) -> str:
        """The scheme the model was pretrained with: its first text stack's (its last: the decoder, in the
        self-check of an encoder-decoder, whose tiny model decodes)."""
        return self.adapter(self.text[0]).native if self.text else self.stacks[0].adapter.native

    def names(self, stacks: tuple[str, ...] | None) -> tuple[str | None, ...]:
        """The stacks a patch naming `stacks` goes into: the one stack of a model of one, else those it names, else
        those that read text (PosEncError where it names stacks a model of one stack does not have)."""
        if self.two_stacks:
            return stacks or self.text
        if stacks is not None:
            raise PosEncError(f"stacks={list(stacks)} applies to encoder-decoder models; {self.model_type!r} has one "
                              "attention stack")
        return (None,)

    def only(self) -> Adapter:
        """The adapter of a model of one stack; PosEncError for an encoder-decoder model (one adapter cannot stand
        for its bidirectional encoder, its causal decoder over a cache and its cross-attention)."""
        if self.two_stacks:
            raise _two_adapters(self.model_type)
        return self.stacks[0].adapter

    def adapter(self, name: str | None) -> Adapter:
        """The adapter of stack `name`, or PosEncError saying why it cannot be read."""
        for stack in self.stacks:
            if stack.name == name:
                return stack.adapter
        raise PosEncError(self.refused.get(name, f"{self.model_type!r} has no {name} stack"))


class ConfigCache(Generic[T]):
    """Values kept per config object (and key), dropped with the config: configs are unhashable dataclasses,
    so they are keyed by identity and held by a weak reference."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, Hashable], tuple[weakref.ref, T]] = {}

    def get(self, config: Any, key: Hashable = None) -> T | None:
        entry = self.entries.get((id(config), key))
        return entry[1] if entry is not None and entry[0]() is config else None

    def put(self, config: Any, value: T, key: Hashable = None) -> T:
        slot = (id(config), key)
        self.entries[slot] = (weakref.ref(config, lambda _, slot=slot: self.entries.pop(slot, None)), value)
        return value


# discovery runs once per config and model class
CACHE: ConfigCache[ModelView] = ConfigCache()


def model_type_of(model_or_config: Any) -> str:
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise PosEncError(f"cannot tell the architecture of {type(model_or_config).__name__}: it has no config.model_type")
    return model_type


@dataclasses.dataclass(frozen=True)
class StockRead:
    """A patched model as it was before its patch, kept on its `PatchState` (`keep`) so that reading it never takes
    the patch off: its view, and its stacks with their stock facts less their tensors, which are read when asked off
    the stack's table modules (the patch's records hold those it replaced, and move them with the model: `.to()`,
    `.half()`) and its token embeddings now."""

    view: ModelView
    stacks: tuple[StockStack, ...]

    def named(self, names: tuple[str | None, ...]) -> tuple[StockStack, ...]:
        """The stacks `names`, their facts' tensors read now."""
        stacks = {stack.name: stack for stack in self.stacks}
        return tuple(dataclasses.replace(stacks[n], facts=stacks[n].tables.read(stacks[n].facts, stacks[n].module))
                     for n in names)


def read(subject: Any, one_stack: bool = False) -> ModelView:
    """The view of `subject` (a model, or a transformers config read as its causal LM), or PosEncError naming what
    could not be placed. `one_stack`: a speech LM read whole, as one stack (what `catalog.adapter_for` answers)."""
    if not one_stack and (kept := _kept(subject)) is not None:
        return kept.view
    config = getattr(subject, "config", subject)
    one_stack = one_stack and is_seq2seq(subject)  # a model of one stack reads alike either way: one discovery
    key = (type(subject) if isinstance(subject, nn.Module) else None, one_stack)
    if (cached := CACHE.get(config, key)) is not None:
        return cached
    view = _two_stacks(subject) if not one_stack and is_seq2seq(subject) else _one_stack(subject)
    return CACHE.put(config, view, key)


def planned(subject: Any) -> Any:
    """What a patch of `subject` is planned on: an encoder-decoder config's model built on the meta device (its two
    stacks are read off an instance), anything else as it is."""
    if not isinstance(subject, nn.Module) and getattr(subject, "is_encoder_decoder", False):
        return meta_model(subject, encoder_decoder=True)
    return subject


def stock(subject: Any, view: ModelView, names: tuple[str | None, ...]) -> tuple[StockStack, ...]:
    """The stacks `names` of `subject` (read by `read` into `view`), each with its module and the facts of its stock
    model. A config's are read off its model on the meta device, without weights: no tables to read, so a scheme
    sizes its codes as it would for unit-scale embeddings."""
    if not names:
        raise PosEncError(f"{view.model_type!r}: no stack reads text")
    if not isinstance(subject, nn.Module):
        adapter = view.adapter(None)
        model = _stock_meta(subject, adapter)
        facts = dataclasses.replace(adapter.facts(model), position_table=None, token_embeddings=None,
                                    device=torch.device("cpu"))
        return (StockStack(None, adapter, model, facts, Tables()),)
    if (kept := _kept(subject)) is not None:
        return kept.named(names)
    found = []
    for name in names:
        adapter = view.adapter(name)
        module = subject if name is None else stack_module(subject, name)
        found.append(StockStack(name, adapter, module, adapter.facts(module), adapter.tables(module)))
    return tuple(found)


def keep(model: nn.Module) -> StockRead:
    """The stock read of `model` (stock now, or patched by a patch that kept one) that a plan reads and the patch
    keeps: every stack it has, so that any of them can be patched later."""
    if (kept := _kept(model)) is not None:
        return kept
    view = read(model)
    stacks = stock(model, view, tuple(stack.name for stack in view.stacks))
    return StockRead(view, tuple(dataclasses.replace(stack, facts=dataclasses.replace(
        stack.facts, position_table=None, bias_table=None, token_embeddings=None)) for stack in stacks))


def _kept(subject: Any) -> StockRead | None:
    """A patched model's stock read, None for a stock model or a config. A state pickled before patches kept one
    (`torch.save` of a patched model) is read once with its patch off, and keeps it from then on."""
    state: PatchState | None = getattr(subject, STATE_ATTR, None)
    if state is None:
        return None
    if state.stock is None:
        state.rollback()
        delattr(subject, STATE_ATTR)
        try:
            state.stock = keep(subject)
        finally:
            state.reapply()
            setattr(subject, STATE_ATTR, state)
    return state.stock


def _one_stack(subject: Any) -> ModelView:
    """A decoder-only or encoder-only model's view: the hand-written adapter of its type, else the generic one."""
    model_type = model_type_of(subject)
    _refuse_encoder_decoder(subject, model_type)
    _refuse_non_text(subject, model_type)
    adapter = ADAPTERS.get(model_type) or _generic(subject)
    return ModelView(model_type, (Stack(None, adapter),), (None,))


def _generic(subject: Any) -> Adapter:
    """The generic adapter, read off the model itself, or off its stock model on the meta device for a config
    alone or a model carrying a patch it has no state of (a reload)."""
    config = getattr(subject, "config", subject)
    model = subject if isinstance(subject, nn.Module) else None
    if model is None or getattr(config, "posenc", None) is not None:
        model = meta_model(config, type(model) if model is not None else None)
    return generic_adapter(model)


def _stock_meta(config: Any, adapter: Adapter) -> nn.Module:
    """The model of a config on the meta device, as its adapter reads it: hand-written adapters name paths in the
    base model (encoders have no causal-LM class); the generic one reads the causal LM."""
    from transformers import AutoModel

    hand_written = adapter.name != "generic" and type(config) in AutoModel._model_mapping
    return meta_model(config, AutoModel._model_mapping[type(config)] if hand_written else None)


def _two_stacks(model: nn.Module) -> ModelView:
    """An encoder-decoder model's view: each stack discovered as a model of its own, the encoder read as
    bidirectional and the decoder as causal whatever the shared config says."""
    model_type = model_type_of(model)
    why = {name: not_text(model, name) for name in STACKS}
    text = tuple(name for name in STACKS if why[name] is None)
    # a patched model with no state of its patch (a reload) is read from its stock structure
    source = model if getattr(model.config, "posenc", None) is None else meta_model(model.config, type(model))
    found, refused = [], {}
    for name in STACKS:
        try:
            found.append(Stack(name, _stack_adapter(source, name)))
        except PosEncError as exc:
            refused[name] = str(exc)
    no_text = None if text else "no stack reads text: " + "; ".join(f"{s}: {why[s]}" for s in STACKS)
    return ModelView(model_type, tuple(found), text, refused, no_text, two_stacks=True)


def is_seq2seq(model: Any) -> bool:
    """An instance with two stacks: an encoder-decoder model (a config alone says True for BART's causal LM
    too), or a speech LM whose own text decoder reads what an audio tower encodes (Voxtral, Qwen2-Audio, ...)."""
    config = getattr(model, "config", None)
    if not (isinstance(model, nn.Module) and callable(getattr(model, "get_encoder", None))
            and callable(getattr(model, "get_decoder", None))):
        return False
    if getattr(config, "is_encoder_decoder", False):
        return True
    decoder = model.get_decoder()
    own_decoder = decoder is not model and decoder is not model.base_model and _token_table(decoder)
    return bool(own_decoder) and compat.encoder_module(model) is not None and not_text(model, "encoder") is not None


def stack_module(model: nn.Module, stack: str) -> nn.Module | None:
    """The stack's module; None for an encoder side the model does not have as a module of its own."""
    return compat.encoder_module(model) if stack == "encoder" else model.get_decoder()


def not_text(model: nn.Module, stack: str) -> str | None:
    """Why a stack's positions are out of scope, read off the instance: no module of its own, or no 2-D token
    embedding table (an audio tower reads features through convolutions: its positions are those of frames,
    not of tokens); None for a text stack."""
    module = stack_module(model, stack)
    if module is None:
        return "the model has no encoder module of its own (get_encoder() returns the model itself)"
    if getattr(module, "config", None) is None or _token_table(module):  # no config: stack_adapter says why
        return None
    reads = next(iter(inspect.signature(module.forward).parameters), "?")
    return (f"{type(module).__name__} has no token embedding table: it reads {reads!r} (features, not token ids), "
            "whose positions are those of audio frames, not of tokens")


def _token_table(module: nn.Module) -> bool:
    try:
        weight = getattr(module.get_input_embeddings(), "weight", None)
    except (NotImplementedError, AttributeError):  # transformers' default refuses stacks it cannot read
        return False
    return isinstance(weight, torch.Tensor) and weight.dim() == 2


def text_stacks(model: nn.Module) -> tuple[str, ...]:
    """The stacks a patch takes by default: those that read text."""
    return tuple(s for s in STACKS if not_text(model, s) is None)


def _stack_adapter(model: nn.Module, stack: str) -> Adapter:
    """The generic adapter of one stack of a stock model, read off that stack as a model of its own; the encoder is
    bidirectional and the decoder causal whatever the shared config says."""
    if (reason := not_text(model, stack)) is not None:
        raise PosEncError(f"{model.config.model_type!r}: the {stack} stack is out of scope ({reason}); patch "
                          f"stacks={list(text_stacks(model))}")
    module = stack_module(model, stack)
    if getattr(module, "config", None) is None:
        raise PosEncError(f"{model.config.model_type!r}: the {stack} stack ({type(module).__name__}) is a plain "
                          "nn.Module without a config, not a transformers model discovery can read on its own")
    try:
        found = discover(module, stack)
    except (NotImplementedError, AttributeError, TypeError, RuntimeError) as exc:  # a stack that is no text model
        raise PosEncError(f"{model.config.model_type!r}: the {stack} stack is not a model discovery can read "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    return dataclasses.replace(adapter_from(found), causal=stack == "decoder")


def _refuse_encoder_decoder(subject: Any, model_type: str) -> None:
    """A model saying it is an encoder-decoder that is not read as two stacks is refused as one (`ModelView.only`).
    Their decoder-only classes (BartForCausalLM, ...) carry is_encoder_decoder=False and are read as one stack."""
    # a config alone is not refused: BartConfig says True even for the BartForCausalLM it builds
    if getattr(getattr(subject, "config", None), "is_encoder_decoder", False):
        raise _two_adapters(model_type)


def _two_adapters(model_type: str) -> PosEncError:
    return PosEncError(f"{model_type!r} is an encoder-decoder model: its two stacks have an adapter each "
                       "(hf_posenc.seq2seq.stack_adapter(model, 'encoder' or 'decoder')); patch, supports and "
                       "supported_schemes take the model itself")


def _refuse_non_text(subject: Any, model_type: str) -> None:
    """Vision and audio models (ViT, wav2vec2, ...) have no token positions to swap: refused by name, not by an
    AttributeError from deep inside discovery. A model must have a 2-D token embedding table; a config alone, a
    vocabulary."""
    if hasattr(subject, "get_input_embeddings"):
        try:
            weight = getattr(subject.get_input_embeddings(), "weight", None)
        except (NotImplementedError, AttributeError):
            weight = None
        text = callable(getattr(weight, "dim", None)) and weight.dim() == 2
    else:
        config = subject.get_text_config(decoder=True) if hasattr(subject, "get_text_config") else subject
        text = getattr(config, "vocab_size", None) is not None
    if not text:
        raise PosEncError(f"{model_type!r} is not a text model (no token embedding table: a vision or audio model); "
                          "hf_posenc patches text models, decoder-only and encoder-only language models: "
                          "`hf-posenc list --model-types` shows what is supported")


__all__ = ["CACHE", "ConfigCache", "ModelView", "Stack", "StockRead", "StockStack", "is_seq2seq", "keep",
           "model_type_of", "not_text", "planned", "read", "stack_module", "stock", "text_stacks"]
