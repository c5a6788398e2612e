"""Where positions enter a model and what it adds there, read through its adapter and its own forward pass."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import sites
from ..adapters.base import ADAPTERS, get_module
from ..catalog import adapter_for, get_scheme
from ..errors import PosEncError
from ..patching import ROTARY_MODULE, describe


def position_kind(model: nn.Module) -> str:
    """'absolute' (a vector is added to each token), 'rotary', 'none', the name of a score-site scheme, or
    'per-layer' (a patch of some layers, or a map: no one kind describes every layer).

    Read from the patch in place (`describe`) or, for an unpatched model, from its adapter.
    """
    adapter, patched = adapter_for(model), describe(model)
    if patched is not None and patched.layers is not None:
        return "per-layer"
    if patched is not None:
        return sites.kind(get_scheme(patched.scheme)) or patched.scheme
    return "absolute" if adapter.slot else "rotary" if adapter.rotation else "none"


def kinds_allowed(kind: str) -> str:
    """Architectures whose unpatched positions are of this kind, for error messages."""
    adapters = {a.name: a for a in ADAPTERS.values()}
    have = {"absolute": lambda a: a.slot, "rotary": lambda a: a.rotation}[kind]
    return ", ".join(sorted(name for name, a in adapters.items() if have(a)))


def max_positions(model: nn.Module) -> int:
    return adapter_for(model).facts(model).max_positions


def check_length(model: nn.Module, length: int) -> None:
    """A text past the position table (or the trained context) is an error, not a silent wrap-around."""
    limit = max_positions(model)
    if length > limit:
        raise PosEncError(
            f"the text is {length} tokens but {model.config.model_type} allows at most {limit} positions; "
            f"shorten --text to {limit} tokens or fewer"
        )


def qk_modules(model: nn.Module, layer: int) -> tuple[nn.Module, nn.Module | None]:
    """The modules whose outputs are layer `layer`'s q and k before any rotation (the adapter's q/k
    taps: after Qwen3's per-head norms); k is None when q, k, v leave one packed projection."""
    adapter = adapter_for(model)
    attention = adapter.attention_modules(model)[layer]
    names = adapter.qk.projections
    if adapter.qk.packed:
        return get_module(attention, names[0]), None
    return get_module(attention, names[0]), get_module(attention, names[1])


def head_shape(model: nn.Module) -> tuple[int, int]:
    """(number of query heads, head dim)."""
    facts = adapter_for(model).facts(model)
    return facts.num_heads, facts.head_dim


class Stop(Exception):
    """Raised from a hook to end a forward pass once the tensors needed are captured."""


def run_until_stop(model: nn.Module, input_ids: Tensor) -> None:
    try:
        model.base_model(input_ids=input_ids)
    except Stop:
        pass


def dummy_ids(model: nn.Module, length: int) -> Tensor:
    # any id that is not padding: RoBERTa numbers positions only for non-padding tokens
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    return torch.full((1, length), (pad + 1) % model.config.vocab_size, dtype=torch.long, device=model.device)



@torch.no_grad()
def token_vectors(model: nn.Module) -> Tensor:
    """The token embeddings the model reads, (vocab, d), fp32: the input embedding module's output for every id,
    not its weight, so a scheme that projects them on the way in (concat's hook) is measured as the model uses them
    (the weight also feeds a tied output head, which training may move into the positions' dimensions)."""
    embed = model.get_input_embeddings()
    return embed(torch.arange(embed.num_embeddings, device=embed.weight.device)).detach().float()


@torch.no_grad()
def position_vectors(model: nn.Module, length: int | None = None) -> Tensor:
    """The vectors the model adds at positions 0..length-1, (length, d), fp32.

    Read from the output of the model's own position module during a forward pass, so table
    offsets (RoBERTa, OPT) and patched input-site codes (sinusoidal) are what the model really uses.
    """
    kind = position_kind(model)
    if kind != "absolute":
        raise PosEncError(
            f"{model.config.model_type} has no position vectors added to its token embeddings (positions: "
            f"{kind}); allowed: {kinds_allowed('absolute')}, or any model patched to an input-site scheme"
        )
    length = max_positions(model) if length is None else length
    check_length(model, length)
    captured: list[Tensor] = []

    def hook(module: nn.Module, args: Any, output: Tensor) -> None:
        captured.append(output.detach().float().reshape(-1, length, output.shape[-1])[0])
        raise Stop

    handle = get_module(model.base_model, adapter_for(model).slot.path).register_forward_hook(hook)
    try:
        run_until_stop(model, dummy_ids(model, length))
    finally:
        handle.remove()
    return captured[0]


def rotary_module(model: nn.Module) -> nn.Module:
    """The module returning (cos, sin): the model's own (possibly rebuilt by a patch) or the patch's."""
    adapter = adapter_for(model)
    return get_module(model.base_model, adapter.rotation.module if adapter.rotation else adapter.at_loop(ROTARY_MODULE))
