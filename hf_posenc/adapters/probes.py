"""Probes of model code for discovery: forward signatures, source text, one call of a rotary module,
a rebuild of it from a changed config, and the words of module names that mean "position"."""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

import torch
from torch import nn

from .. import compat

POSITION_WORDS = {"position", "positions", "positional", "rotary", "rope", "alibi", "relative", "distance", "wpe",
                  "pos", "rel", "sinusoidal"}
INDEX_BUFFERS = ("position_ids", "token_type_ids")  # index helpers, not position codes
MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask", "create_bidirectional_mask",
                 "create_masks_for_generate")


def find_rotaries(owner: nn.Module) -> list[str]:
    """Modules computing RoPE (cos, sin): a rotary class or an `inv_freq` buffer; outermost only."""
    found: list[str] = []
    for name, module in owner.named_modules():
        buffers = [b for b, _ in module.named_buffers(recurse=False)]
        if "rotary" in type(module).__name__.lower() or any(b == "inv_freq" or b.endswith("_inv_freq") for b in buffers):
            if not any(name.startswith(f + ".") for f in found):
                found.append(name)
    return found


def rotary_call(rotary: nn.Module, rope: dict[str, Any] | None,
                layer_types: tuple[str, ...] | None) -> tuple[tuple[str, ...], dict[str, int], str | None]:
    """(layer types the rotary is called with, width of cos/sin per layer type ("" if called without one),
    problem) from one call per layer type on 3 positions."""
    params = inspect.signature(rotary.forward).parameters
    kinds: tuple[str, ...] = ()
    if "layer_type" in params:
        kinds = tuple(sorted(k for k, v in (rope or {}).items()  # the types its layers use (it builds only those)
                             if isinstance(v, dict) and (not layer_types or k in layer_types)))
        if not kinds:
            kinds = tuple(sorted(set(layer_types or ())))
        if not kinds:
            return (), {}, f"{type(rotary).__name__} takes a layer_type but the config names none"
    tensor = next(iter(rotary.buffers()), None)
    device = tensor.device if tensor is not None else torch.device("cpu")
    widths: dict[str, int] = {}
    for kind in kinds or ("",):
        try:
            out = rotary(torch.zeros(1, 3, 1, device=device), torch.arange(3, device=device)[None],
                         **({"layer_type": kind} if kind else {}))
        except Exception as exc:  # noqa: BLE001 - a rotary we cannot call is reported, not fatal to discovery
            return kinds, widths, f"{type(rotary).__name__}(x, position_ids) failed: {type(exc).__name__}: {exc}"
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
            shape = getattr(out, "shape", None)
            return kinds, widths, (f"{type(rotary).__name__} returns {type(out).__name__}"
                                   f"{tuple(shape) if shape else ''}, not (cos, sin)")
        widths[kind] = int(out[0].shape[-1])
    return kinds, widths, None


# What each RoPE type a scheme installs adds to rope_parameters, for the rebuild probe (pairs: rotated pairs).
ROPE_PROBES: dict[str, Any] = {
    "default": lambda pairs: {},
    "linear": lambda pairs: {"factor": 2.0},
    "dynamic": lambda pairs: {"factor": 2.0},
    "yarn": lambda pairs: {"factor": 2.0, "beta_fast": 32.0, "beta_slow": 1.0},
    "llama3": lambda pairs: {"factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "longrope": lambda pairs: {"factor": 2.0, "short_factor": [1.0] * pairs, "long_factor": [2.0] * pairs},
}


def rebuild_problems(rotary: nn.Module, text: Any) -> dict[str, str]:
    """{rope type: why the rotary class cannot be rebuilt from the config with that type's rope_parameters}
    (the way a scaling patch rebuilds it), each type probed on its own so one failing disables only its
    schemes. Built from a copy with head_dim filled in, as the installer builds it (`compat.with_head_dim`)."""
    own = getattr(text, "rope_parameters", None) or {}
    length = int(getattr(text, "max_position_embeddings", None) or 128)
    base = compat.with_head_dim(copy.deepcopy(text))
    head_dim = getattr(base, "head_dim", None) or 2
    pairs = int(head_dim * float(own.get("partial_rotary_factor", 1.0))) // 2
    problems, outputs = {}, {}
    for rope_type, extra in ROPE_PROBES.items():
        config = copy.deepcopy(base)
        config.rope_parameters = {"rope_type": rope_type, "rope_theta": float(own.get("rope_theta", 10_000.0)),
                                  "original_max_position_embeddings": length, **extra(pairs),
                                  **{k: own[k] for k in ("partial_rotary_factor",) if k in own}}
        try:
            # on the CPU, whatever device the model is being built on (transformers builds loads on meta)
            with torch.device("cpu"):
                outputs[rope_type] = type(rotary)(config=config)(torch.zeros(1, 3, 1), torch.arange(3)[None])
        except Exception as exc:  # noqa: BLE001 - reported as a gap of this rope type's rebuild
            problems[rope_type] = (f"{type(rotary).__name__}(config) fails with a {rope_type} rope_parameters "
                                   f"({type(exc).__name__}: {exc})")
    if "default" in outputs and "linear" in outputs and all(map(torch.equal, outputs["default"], outputs["linear"])):
        # a class that builds its table without reading rope_parameters (GPT-J's and CodeGen's in transformers
        # 5.24): every rebuild would silently keep the stock rotation
        ignored = f"{type(rotary).__name__}(config) ignores rope_parameters (a linear x2 scaling left its output as it was)"
        problems.update(dict.fromkeys(ROPE_PROBES, ignored))
    return problems


def slot_call(slot: nn.Module) -> str | None:
    """None if the slot is called with position ids alone (nn.Embedding or forward(position_ids)),
    else its signature: the installer would need a shim to call a new code the same way."""
    if type(slot).forward is nn.Embedding.forward:
        return None
    params = [p for p in inspect.signature(slot.forward).parameters.values()
              if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    required = [p for p in params if p.default is p.empty]
    if len(required) == 1 and required[0].name in ("position_ids", "positions", "input"):
        return None
    return f"{type(slot).__name__}({', '.join(p.name for p in params)})"


def native_bias(block: nn.Module | None) -> str | None:
    if block is None:
        return None
    params = inspect.signature(type(block).forward).parameters
    return next((p for p in ("alibi", "position_bias") if p in params), None)


def native_bias_kind(text: Any, argument: str | None, switched: bool = False) -> str | None:
    """Falcon and MPT say in their config whether they use ALiBi; BLOOM always does; other block
    biases (CPM-Ant's `position_bias`) are learned relative buckets. `switched`: the base model has a switch
    for a bias that no block argument carries (Falcon from transformers 5.25 on)."""
    if argument is None and not switched:
        return None
    flags = [getattr(text, "alibi", None), getattr(getattr(text, "attn_config", None), "alibi", None)]
    flag = next((f for f in flags if f is not None), None)
    if flag is not None:
        return "alibi" if flag else None
    return "alibi" if argument == "alibi" else "relative"


def rotation_off(text: Any, attention: nn.Module | None, flag: str | None) -> bool:
    """The attention's own code skips its rotation when the config's `flag` is on, and it is on."""
    return bool(flag and getattr(text, flag, False) and attention is not None
                and source_has(type(attention).forward, (f"config.{flag}",)))


def causal(text: Any, owner: nn.Module) -> bool:
    """Decoders are causal; BERT-style models only when built as decoders (`is_decoder`)."""
    if source_has(type(owner).forward, ("is_decoder",)):
        return bool(getattr(text, "is_decoder", False))
    return True


def source_has(function: Any, words: tuple[str, ...]) -> bool:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return any(w in source for w in words)


def chain(owner: nn.Module, layers: str, block: nn.Module, attention: str) -> list[nn.Module]:
    """The modules a call goes through from the loop owner down to the attention module."""
    def along(root: nn.Module, path: str) -> list[nn.Module]:
        parts = path.split(".") if path else []
        return [root.get_submodule(".".join(parts[:i])) for i in range(1, len(parts) + 1)]

    inner = [m for m in along(owner, layers) if not isinstance(m, nn.ModuleList)]
    return [owner, *inner, block, *(m for m in along(block, attention) if not isinstance(m, nn.ModuleList))]


def takes_kwargs(module: nn.Module) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(type(module).forward).parameters.values())


def relays_kwargs(links: list[nn.Module], block: nn.Module) -> bool:
    """Private kwargs reach the attention module if a pre-hook on the block hands them over: everything
    above the block passes **kwargs on, the block takes them (and drops them), the attention passes them on."""
    above = links[:links.index(block)]
    return all(passes_kwargs(m) for m in above) and takes_kwargs(block) and passes_kwargs(links[-1])


def passes_kwargs(module: nn.Module) -> bool:
    """forward takes **kwargs and hands them on (the name appears again after the signature)."""
    forward = type(module).forward
    var = next((p.name for p in inspect.signature(forward).parameters.values() if p.kind is p.VAR_KEYWORD), None)
    try:
        return var is not None and inspect.getsource(forward).count(f"**{var}") >= 2
    except (OSError, TypeError):
        return False


def name_words(name: str) -> set[str]:
    """Lower-case words of a snake_case attribute or CamelCase class name."""
    return {w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", part)}


def unexplained(base: nn.Module, placed: list[str], text: Any, has_rotary: bool,
                rope_switch: tuple[str, Any] | None) -> tuple[str, ...]:
    """Position-like modules, buffers and config fields anywhere in the base model (an encoder or a
    vision tower included) that discovery did not place; paths from the base model. Containers of
    placed modules (a ModuleList of rotaries) are not listed."""
    def placed_or_container(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") or p.startswith(name + ".") for p in placed)

    names: list[str] = []
    for name, module in base.named_modules():
        words = name_words(name.rsplit(".", 1)[-1]) | name_words(type(module).__name__)
        if name and not placed_or_container(name) and words & POSITION_WORDS:
            names.append(f"module {name} ({type(module).__name__})")
    for name, _ in base.named_buffers():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in INDEX_BUFFERS and not placed_or_container(name) and name_words(leaf) & POSITION_WORDS:
            names.append(f"buffer {name}")
    kind = getattr(text, "position_embedding_type", None)
    if kind not in (None, "absolute", "rope"):
        names.append(f"config.position_embedding_type={kind!r}")
    rope_off = rope_switch is not None and getattr(text, rope_switch[0], None) != rope_switch[1]
    if getattr(text, "rope_parameters", None) and not has_rotary and not rope_off:
        names.append("config.rope_parameters, but no rotary module")
    return tuple(names)
