"""Questions over the registry: which adapter a model takes, which attention stacks a patch goes into (with their
stock facts), which schemes a model supports and why not, the support matrix and its snapshot. Above schemes, adapters and encoder-decoder stacks: importing it registers
every built-in one, and `hf_posenc.registry` stays a table they write into."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from torch import nn

from . import adapters, schemes  # noqa: F401  (import registers them)
from . import seq2seq, sites
from .adapters.base import Adapter
from .adapters.generic import generic_adapter
from .adapters.meta import meta_model
from .config import STACKS, LayerMap, PosEncConfig, options_snapshot
from .errors import PosEncError, Unsupported, did_you_mean
from .registry import ADAPTERS, SCHEMES, SNAPSHOT
from .schemes.base import ModelFacts, Scheme


def list_schemes() -> list[str]:
    return sorted(SCHEMES)


def list_architectures() -> list[str]:
    return sorted(ADAPTERS)


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise PosEncError(f"unknown scheme {name!r}{did_you_mean(name, SCHEMES)}; available schemes: "
                          f"{', '.join(sorted(SCHEMES))}")
    return SCHEMES[name]


def model_type_of(model_or_config: Any) -> str:
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise PosEncError(f"cannot tell the architecture of {type(model_or_config).__name__}: it has no config.model_type")
    return model_type


def adapter_for(model_or_config: Any) -> Adapter:
    """The hand-written adapter of the model type, else the generic one read from the model itself
    (a PosEncError says what it could not place)."""
    model_type = model_type_of(model_or_config)
    refuse_encoder_decoder(model_or_config, model_type)
    refuse_non_text(model_or_config, model_type)
    if model_type in ADAPTERS:
        return ADAPTERS[model_type]
    return generic_adapter(model_or_config)


def refuse_encoder_decoder(model_or_config: Any, model_type: str) -> None:
    """One adapter cannot stand for an encoder-decoder model's two stacks (bidirectional encoder, causal
    decoder over a cache, cross-attention without positions): `patch`, `supports` and `supported_schemes`
    take such a model stack by stack (hf_posenc.seq2seq). Their decoder-only classes (BartForCausalLM, ...)
    carry is_encoder_decoder=False and go through the adapters as usual."""
    # a config alone is not refused: BartConfig says True even for the BartForCausalLM it builds
    if getattr(getattr(model_or_config, "config", None), "is_encoder_decoder", False):
        raise PosEncError(f"{model_type!r} is an encoder-decoder model: its two stacks have an adapter each "
                          "(hf_posenc.seq2seq.stack_adapter(model, 'encoder' or 'decoder')); patch, supports and "
                          "supported_schemes take the model itself")


def refuse_non_text(model_or_config: Any, model_type: str) -> None:
    """Vision and audio models (ViT, wav2vec2, ...) have no token positions to swap: refused by name, not
    by an AttributeError from deep inside discovery. A model must have a 2-D token embedding table; a
    config alone, a vocabulary."""
    if hasattr(model_or_config, "get_input_embeddings"):
        try:
            weight = getattr(model_or_config.get_input_embeddings(), "weight", None)
        except (NotImplementedError, AttributeError):
            weight = None
        text = callable(getattr(weight, "dim", None)) and weight.dim() == 2
    else:
        config = model_or_config
        if hasattr(config, "get_text_config"):
            config = config.get_text_config(decoder=True)
        text = getattr(config, "vocab_size", None) is not None
    if not text:
        raise PosEncError(f"{model_type!r} is not a text model (no token embedding table: a vision or audio model); "
                          "hf_posenc patches text models, decoder-only and encoder-only language models: "
                          "`hf-posenc list --model-types` shows what is supported")


@dataclasses.dataclass(frozen=True)
class AttentionStack:
    """One attention stack of a model as a patch reads it: its name (None for a model of one stack), its adapter,
    its module (a config's model built on the meta device) and the facts of its stock model."""

    name: str | None
    adapter: Adapter
    module: nn.Module
    facts: ModelFacts


def stacks_of(subject: Any, patch: PosEncConfig | LayerMap) -> list[AttentionStack]:
    """The attention stacks `patch` goes into, refusing a scheme a stack cannot take (`Unsupported`; a per-layer
    patch's entries are checked layer by layer, `sites.layers`). `subject`: a model as it was before any patch, or
    the config of a model of one stack (read off its model built on the meta device, without weights: no tables to
    read, so a scheme sizes its codes as it would for unit-scale embeddings)."""
    model_type = model_type_of(subject)
    if not seq2seq.is_seq2seq(subject):
        if patch.stacks is not None:
            raise PosEncError(f"stacks={list(patch.stacks)} applies to encoder-decoder models; {model_type!r} has one "
                              "attention stack")
        adapter = adapter_for(subject)
        if patch.layers is None and (reason := sites.why_not(adapter, spec := get_scheme(patch.scheme))):
            supported = supported_schemes(subject)
            raise Unsupported(f"{model_type!r} models ({adapter.name} adapter) cannot take scheme {spec.name!r} "
                              f"({reason}); supported: {', '.join(supported) or 'none'}", spec.name, reason, supported)
        if isinstance(subject, nn.Module):
            return [AttentionStack(None, adapter, subject, adapter.facts(subject))]
        model = stock_meta(subject)
        facts = dataclasses.replace(adapter.facts(model), position_table=None, token_embeddings=None,
                                    device=torch.device("cpu"))
        return [AttentionStack(None, adapter, model, facts)]
    if patch.layers is None and (reason := stacks_why_not(subject, get_scheme(patch.scheme), patch.stacks)):
        raise Unsupported(f"{model_type!r} cannot take scheme {patch.scheme!r} ({reason})", patch.scheme, reason,
                          supported_schemes(subject))
    names = patch.stacks or seq2seq.text_stacks(subject)
    if not names:
        raise PosEncError(f"{model_type!r}: no stack reads text")
    found = [(name, seq2seq.stack_adapter(subject, name), seq2seq.stack_module(subject, name)) for name in names]
    return [AttentionStack(name, adapter, module, adapter.facts(module)) for name, adapter, module in found]


def stock_meta(config: Any) -> nn.Module:
    """The model of a transformers config on the meta device, as its adapter reads it: hand-written adapters
    name paths in the base model (encoders have no causal-LM class); the generic one reads the causal LM."""
    from transformers import AutoModel

    hand_written = config.model_type in ADAPTERS and type(config) in AutoModel._model_mapping
    return meta_model(config, AutoModel._model_mapping[type(config)] if hand_written else None)


def supported_schemes(model_or_config: Any) -> list[str]:
    if seq2seq.is_seq2seq(model_or_config):
        return sorted(name for name, scheme in SCHEMES.items() if stacks_why_not(model_or_config, scheme) is None)
    adapter = adapter_for(model_or_config)
    return sorted(name for name, scheme in SCHEMES.items() if sites.why_not(adapter, scheme) is None)


def why_not(model_or_config: Any, scheme: str) -> str | None:
    """None if `scheme` can be patched into this model (or config), else the reason it cannot."""
    if seq2seq.is_seq2seq(model_or_config):
        return stacks_why_not(model_or_config, get_scheme(scheme))
    return sites.why_not(adapter_for(model_or_config), get_scheme(scheme))


def stacks_why_not(model: nn.Module, spec: Scheme, stacks: tuple[str, ...] | None = None) -> str | None:
    """None if every stack in `stacks` (default: the text stacks) takes `spec`, else the first reason."""
    stacks = stacks or seq2seq.text_stacks(model)
    if not stacks:
        return "no stack reads text: " + "; ".join(f"{s}: {seq2seq.not_text(model, s)}" for s in STACKS)
    for stack in stacks:
        try:
            reason = sites.why_not(seq2seq.stack_adapter(model, stack), spec)
        except PosEncError as exc:
            reason = str(exc)
        if reason is not None:
            return f"{stack}: {reason}"
    return None


def supports(model_or_config: Any, scheme: str) -> bool:
    """True if `scheme` can be patched into this model (or config); the support matrix."""
    try:
        return get_scheme(scheme).name in supported_schemes(model_or_config)
    except PosEncError:
        return False


def support_matrix() -> dict[str, dict[str, bool]]:
    """{adapter name: {scheme: supported}} for docs and `hf-posenc list`."""
    by_name = {a.name: a for a in ADAPTERS.values()}
    return {name: {s: sites.why_not(a, SCHEMES[s]) is None for s in sorted(SCHEMES)} for name, a in sorted(by_name.items())}


def snapshot() -> dict[str, Any]:
    """The registry as data: architectures, {scheme: [site, citation]}, each scheme's options (what `PosEncConfig`
    checks without torch) and the support matrix."""
    return {"architectures": list_architectures(),
            "schemes": {name: [scheme.site, scheme.citation] for name, scheme in sorted(SCHEMES.items())},
            "options": {name: options_snapshot(scheme.Options) for name, scheme in sorted(SCHEMES.items())},
            "matrix": support_matrix()}


def write_snapshot() -> None:
    """Refresh `SNAPSHOT` after adding a scheme or an adapter (tests/test_cli.py checks it is current)."""
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
