"""Where positions enter a decoder, read from the model instance itself rather than from a list of
model names: the module tree, weight shapes, forward signatures, and one call of the rotary module
on three positions. All of it is static (no model forward), so a model built on the meta device
from a config alone is enough.

The result is a `Structure`, plain data: the generic adapter is built from it and the zoo catalog
prints it. Anything that looks like a position (a module, buffer or config field) that discovery
cannot place is listed in `unexplained`, so the adapter refuses the model instead of patching it
halfway.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import compat
from . import quirks
from .base import PACKED_SPLITS
from .probes import (MASK_BUILDERS, causal, chain, find_rotaries, native_bias, native_bias_kind, passes_kwargs,
                     rebuild_problems, relays_kwargs, rotary_call, slot_call, source_has, takes_kwargs, unexplained)
from .quirks import ROPE_SWITCHES, packed_layout, positions_field

# Child names transformers uses for q/k, in the order they are tapped: norms first (RoPE comes
# after q/k normalisation in Qwen3, OLMo 2, Gemma 3, ...), then separate projections.
QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_layernorm", "key_layernorm"))
QK_PROJECTIONS = (("q_proj", "k_proj"), ("query", "key"), ("q_lin", "k_lin"), ("Wq", "Wk"),
                  ("query_proj", "key_proj"), ("project_q", "project_k"), ("q", "k"))
PACKED = ("c_attn", "qkv_proj", "query_key_value", "Wqkv", "qkv", "W_pack")
LATENT = "kv_a_proj_with_mqa"  # multi-head latent attention (DeepSeek V2/V3, MiniCPM3, ...)
CROSS = ("encoder_attn", "crossattention", "cross_attn", "cross_attention", "EncDecAttention")
# T5-style learned bucket tables inside a layer: the bias is computed there and handed down the stack
BIAS_TABLES = ("relative_attention_bias",)
# layer kinds without softmax attention in `config.layer_types` (hybrid SSM / linear-attention models)
NO_ATTENTION_KINDS = ("linear_attention", "mamba", "conv", "recurrent", "mlp", "moe")
SLOT_NAMES = ("wpe", "position_embeddings", "embed_positions", "positions_embed", "position_embedding")
OUTSIDE = "<outside base_model>."  # prefix of a path discovery found outside the base model
STANDARD_ROPE_TYPES = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"}


@dataclass(frozen=True)
class Structure:
    """What discovery found in one model. Paths: `base` from the model root; `loop_owner`, `layers`,
    `rotary`, `slot` from `base`; `attention` from one block; `taps` from the attention."""

    model_type: str
    composite: bool  # text settings live in a sub-config (multimodal wrappers)
    base: str
    loop_owner: str  # the module whose forward runs the layer loop, from base ("": base itself)
    layers: str
    num_layers: int
    attention: str | None
    attention_class: str | None
    attention_layers: tuple[int, ...]  # blocks with softmax self-attention
    attention_paths: tuple[str, ...]  # every distinct attention path seen (more than one: shared blocks)
    attention_outside: tuple[str, ...]  # q/k-holding modules outside the layer list (vision towers, 2nd stacks)
    cross_attention: bool
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int | None  # config.hidden_size: the width of the hidden states position codes are added to
    taps: tuple[str, ...]
    tap_kind: str | None  # "norms", "projections", "packed", "latent"
    tap_per_head: bool  # tap outputs are (B, L, H, D) rather than (B, L, H*D)
    tap_layout: str | None  # packed projections: order of q, k, v (quirks.PACKED_LAYOUTS)
    tap_problem: str | None
    rotary: tuple[str, ...]
    rotary_class: str | None
    rotary_inside_layers: bool
    rotary_layer_types: tuple[str, ...]  # the rotary forward takes a layer type (Gemma 2/3 style)
    rotary_width: int | None  # last dim of (cos, sin)
    rotary_widths: dict[str, int]  # that width per layer type ("": called without one)
    rotary_problem: str | None
    rebuild_problems: dict[str, str]  # rope type -> why the rotary class cannot be rebuilt with it
    rope_parameters: dict[str, Any] | None
    extra_rope_keys: tuple[str, ...]  # the model's own, which a new rope_parameters keeps
    own_rope_types: tuple[str, ...]  # rope_type values transformers' ROPE_INIT_FUNCTIONS does not know
    slot: str | None
    slot_class: str | None
    slot_offset: int
    slot_adds_offset: bool  # the slot adds `slot_offset` to the ids itself (OPT, BART), else they include it
    slot_learned: bool  # has trainable parameters (a table, or factors of one like Reformer's axial tables)
    slot_call: str | None  # None if the model calls it with position ids alone
    slot_width: int | None  # width of the code the slot returns (table columns, or `embedding_dim`)
    token_type_ids: bool
    other_embeddings: tuple[str, ...]
    native_bias: str | None  # block argument carrying a native score bias ("alibi", "position_bias")
    native_bias_kind: str | None  # "alibi", "relative" (learned buckets), None: absent or switched off
    attention_interface: bool  # attention goes through ALL_ATTENTION_FUNCTIONS
    mask_interface: bool  # the mask comes from masking_utils (AttentionMaskInterface)
    private_kwargs: bool  # loop owner -> block -> attention pass **kwargs through
    relay_kwargs: bool  # all but the block do, which takes **kwargs: a block pre-hook can hand them over
    bias_table: str | None  # T5's bucket table (from base), computed in one layer and shared down the stack
    carry_kwargs: bool  # the loop calls blocks without them, the attention takes **kwargs: hooks carry them
    loop_takes: tuple[str, ...]  # input_ids / position_ids / inputs_embeds accepted by the loop owner's forward
    causal: bool
    layer_types: tuple[str, ...] | None
    sliding_window: int | None
    max_positions: int | None  # config.max_position_embeddings (ALiBi models have none)
    latent_attention: bool
    hybrid: bool
    unexplained: tuple[str, ...] = field(default=())
    positions_field: str = "max_position_embeddings"  # the config field sizing the position table

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def discover(model: nn.Module, stack: str | None = None) -> Structure:
    """Read the position structure of a (causal LM) transformers model, or of one stack ("encoder", "decoder")
    of an encoder-decoder model."""
    config, text = model.config, compat.text_config(model.config)
    names = {id(m): n for n, m in model.named_modules()}
    base = model.base_model
    owner = _loop_owner(model)
    depth = int(getattr(text, "num_hidden_layers", 0) or 0)
    layers_path, blocks = _layer_list(owner, depth)
    heads, kv_heads, head_dim = _head_sizes(text)
    layer_types = tuple(text.layer_types) if isinstance(getattr(text, "layer_types", None), (list, tuple)) else None

    found = [_attention_in(block, i, layer_types) for i, block in enumerate(blocks)]
    attention_layers = tuple(i for i, path in enumerate(found) if path is not None)
    paths = tuple(dict.fromkeys(p for p in found if p is not None))
    attention_path = max(paths, key=found.count) if paths else None
    attention = blocks[attention_layers[0]].get_submodule(found[attention_layers[0]]) if attention_layers else None
    tap = _taps(attention, config.model_type, heads, kv_heads, head_dim) if attention is not None else \
        {"taps": (), "tap_kind": None, "tap_per_head": False, "tap_layout": None,
         "tap_problem": "no self-attention module with q/k projections in any block"}

    rotaries = find_rotaries(owner)

    slot, slot_module = _slot(owner, layers_path, rotaries, model.get_input_embeddings())
    table = next((n for n, _ in owner.named_modules() if n.startswith(layers_path + ".")
                  and n.rsplit(".", 1)[-1] in BIAS_TABLES), None)
    owner_to_base = _relative(names[id(owner)], names[id(base)])
    rotary = _rotary_fields(owner, rotaries, layers_path, text, layer_types, owner_to_base)
    bias = native_bias(blocks[0] if blocks else None)
    loop_params = inspect.signature(type(owner).forward).parameters
    first_block = blocks[attention_layers[0]] if attention_layers else None
    links = chain(owner, layers_path, first_block, found[attention_layers[0]]) if attention is not None else []
    passed = bool(links) and all(passes_kwargs(m) for m in links)
    # a hook on the block hands private kwargs to its one attention module (the relay, or the carry)
    one_attention = bool(links) and sum(map(holds_qk, first_block.modules())) == 1
    relayed = not passed and one_attention and relays_kwargs(links, first_block)
    return Structure(
        model_type=config.model_type,
        composite=text is not config,
        base=names[id(base)],
        loop_owner=owner_to_base,
        layers=_join(owner_to_base, layers_path),
        num_layers=len(blocks),
        attention=attention_path,
        attention_class=type(attention).__name__ if attention is not None else None,
        attention_layers=attention_layers,
        attention_paths=paths,
        attention_outside=tuple(n for n, m in owner.named_modules()
                                if n and not n.startswith(layers_path + ".") and holds_qk(m)),
        cross_attention=any(any(c in n for c in CROSS) for b in blocks[:1] for n, _ in b.named_modules()),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=getattr(text, "hidden_size", None),
        **tap,
        **rotary,
        **_embedding_fields(owner, slot, slot_module, owner_to_base),
        native_bias=bias,
        native_bias_kind=native_bias_kind(text, bias),
        attention_interface=attention is not None and source_has(type(attention), ("ALL_ATTENTION_FUNCTIONS",)),
        mask_interface=source_has(inspect.getmodule(type(owner)), MASK_BUILDERS),
        private_kwargs=passed,
        relay_kwargs=relayed,
        bias_table=_join(owner_to_base, table) if table else None,
        # the carry's hook sits on the block, so the attention must be a module inside it (not XLM's list)
        carry_kwargs=not passed and not relayed and one_attention and bool(attention_path) and takes_kwargs(links[-1]),
        loop_takes=tuple(p for p in ("input_ids", "position_ids", "inputs_embeds") if p in loop_params),
        causal=causal(text, owner),
        layer_types=layer_types,
        sliding_window=getattr(text, "sliding_window", None),
        max_positions=getattr(text, positions_field(config.model_type, stack), None),
        latent_attention=tap["tap_kind"] == "latent",
        hybrid=len(attention_layers) < len(blocks),
        unexplained=unexplained(base, [_join(owner_to_base, p) for p in (*rotaries, *([slot] if slot else []),
                                                                         *([table] if table else []))],
                                text, bool(rotaries), ROPE_SWITCHES.get(config.model_type)),
        positions_field=positions_field(config.model_type, stack),
    )


def _embedding_fields(owner: nn.Module, slot: str | None, slot_module: nn.Module | None,
                      owner_to_base: str) -> dict[str, Any]:
    """The embedding part of a `Structure`: the position slot, how it is called, the other embeddings."""
    return dict(
        slot=_join(owner_to_base, slot) if slot else None,
        slot_class=type(slot_module).__name__ if slot_module is not None else None,
        slot_offset=_slot_offset(slot_module),
        slot_adds_offset=_adds_offset(slot_module),
        slot_learned=slot_module is not None and any(p.requires_grad for p in slot_module.parameters()),
        slot_call=slot_call(slot_module) if slot_module is not None else None,
        slot_width=_slot_width(slot_module),
        token_type_ids=_has_buffer(owner, "embeddings.token_type_ids"),
        other_embeddings=tuple(_join(owner_to_base, p) for p in ("embeddings.token_type_embeddings",)
                               if _has_module(owner, p)),
    )


def _rotary_fields(owner: nn.Module, rotaries: list[str], layers_path: str, text: Any,
                   layer_types: tuple[str, ...] | None, owner_to_base: str) -> dict[str, Any]:
    """The rotary part of a `Structure`: the model's rotary modules, how they are called, its RoPE parameters."""
    in_layers = [r for r in rotaries if r.startswith(layers_path + ".")]
    rotary_modules = [owner.get_submodule(r) for r in rotaries]
    rope = getattr(text, "rope_parameters", None) or None
    rotary_types, widths, rotary_problem = rotary_call(rotary_modules[0], rope, layer_types) if rotaries else \
        ((), {}, None)
    per_type = bool(rope) and all(isinstance(v, dict) or v is None for v in rope.values())
    own_keys = set().union(*(v or {} for v in rope.values())) if per_type else set(rope or {})
    return dict(
        rotary=tuple(_join(owner_to_base, r) for r in rotaries),
        rotary_class=type(rotary_modules[0]).__name__ if rotaries else None,
        rotary_inside_layers=bool(in_layers),
        rotary_layer_types=rotary_types,
        rotary_width=next(iter(widths.values()), None),
        rotary_widths=widths,
        rotary_problem=rotary_problem,
        rebuild_problems=rebuild_problems(rotary_modules[0], text) if rotaries and not rotary_types else {},
        rope_parameters=dict(rope) if rope else None,
        extra_rope_keys=tuple(sorted(own_keys - compat.ROPE_KEYS)),
        own_rope_types=tuple(sorted({p.get("rope_type", "default") for p in (rope.values() if per_type else [rope])
                                     if p} - STANDARD_ROPE_TYPES)) if rope else (),
    )


def _head_sizes(text: Any) -> tuple[int, int, int]:
    from ..errors import PosEncError

    heads = getattr(text, "num_attention_heads", None)
    if not heads:
        raise PosEncError(f"{text.model_type!r}: its config has no num_attention_heads (a state-space or recurrent "
                          "model without attention, or sub-models the adapter does not read)")
    try:
        head_dim = quirks.head_dim(text) or text.hidden_size // heads
    except RuntimeError as exc:  # heterogeneous layers refuse a global head_dim (Gemma 4)
        raise PosEncError(f"{text.model_type!r}: layers differ in shape ({exc}); the adapter needs one head layout") from exc
    return int(heads), int(getattr(text, "num_key_value_heads", None) or heads), int(head_dim)


def _loop_owner(model: nn.Module) -> nn.Module:
    """`get_decoder()` when it holds the layers (some models name their LM head `decoder`)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    has_layers = isinstance(decoder, nn.Module) and any(isinstance(m, nn.ModuleList) for m in decoder.modules())
    return decoder if has_layers else model.base_model


def _layer_list(owner: nn.Module, depth: int) -> tuple[str, list[nn.Module]]:
    """The shallowest ModuleList with one entry per hidden layer (the longest one if none matches)."""
    lists = [(n, m) for n, m in owner.named_modules() if isinstance(m, nn.ModuleList) and len(m) and n]
    if not lists:
        from ..errors import PosEncError

        raise PosEncError(f"{type(owner).__name__} holds no ModuleList of layers; cannot find the layer loop")
    exact = [(n, m) for n, m in lists if len(m) == depth]
    name, modules = min(exact, key=lambda x: x[0].count(".")) if exact else max(lists, key=lambda x: len(x[1]))
    return name, list(modules)


def _attention_in(block: nn.Module, index: int, layer_types: tuple[str, ...] | None) -> str | None:
    """Path of the self-attention module in `block`: the shallowest module holding q/k projections,
    skipping cross-attention and layers the config declares attention-free."""
    if layer_types and index < len(layer_types) and layer_types[index] in NO_ATTENTION_KINDS:
        return None
    for name, module in sorted(block.named_modules(), key=lambda x: x[0].count(".") if x[0] else -1):
        if not any(c in name for c in CROSS) and "cross" not in type(module).__name__.lower() and holds_qk(module):
            return name
    return None


def holds_qk(module: nn.Module) -> bool:
    children = dict(module.named_children())
    return (any(q in children and k in children for q, k in QK_NORMS + QK_PROJECTIONS)
            or any(p in children for p in PACKED) or LATENT in children)


def _out_features(module: nn.Module) -> int | None:
    if isinstance(module, nn.Linear):
        return module.out_features
    if hasattr(module, "nf"):  # transformers' Conv1D (GPT-2 family)
        return int(module.nf)
    weight = getattr(module, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def _taps(attention: nn.Module, model_type: str, heads: int, kv_heads: int, head_dim: int) -> dict[str, Any]:
    """Where q and k leave their projections: tap names, kind, per-head output, packed layout, and
    the problem that keeps the q/k installer from using them (None if it can)."""
    children = dict(attention.named_children())

    def tap(names: tuple[str, ...], kind: str, problem: str | None, per_head: bool = False,
            layout: str | None = None) -> dict[str, Any]:
        return {"taps": names, "tap_kind": kind, "tap_per_head": per_head, "tap_layout": layout, "tap_problem": problem}

    for q, k in QK_NORMS:
        if q in children and k in children:
            size = children[q].weight.numel() if getattr(children[q], "weight", None) is not None else None
            if size in (head_dim, heads * head_dim):
                return tap((q, k), "norms", None, per_head=size == head_dim)
            return tap((q, k), "norms", f"{q} normalises {size} features; expected head_dim={head_dim} or heads*head_dim")
    for q, k in QK_PROJECTIONS:
        if q in children and k in children:
            q_out, k_out = _out_features(children[q]), _out_features(children[k])
            if (q_out, k_out) == (heads * head_dim, kv_heads * head_dim):
                return tap((q, k), "projections", None)
            return tap((q, k), "projections", f"{q}/{k} emit {q_out}/{k_out} features, not heads*head_dim="
                       f"{heads * head_dim} / kv_heads*head_dim={kv_heads * head_dim} (gated or split queries)")
    if LATENT in children:
        return tap((LATENT,), "latent", "multi-head latent attention: RoPE acts on a qk_rope_head_dim slice of each "
                   "head, computed after the latent projections, so there is no projection output to rotate")
    for name in PACKED:
        if name in children:
            width, expected = _out_features(children[name]), (heads + 2 * kv_heads) * head_dim
            layout = packed_layout(model_type, attention)
            if width != expected:
                return tap((name,), "packed", f"{name} emits {width} features, not (heads + 2*kv_heads)*head_dim="
                           f"{expected} (multi-query or another packing)", layout=layout)
            if layout in PACKED_SPLITS and heads == kv_heads:
                return tap((name,), "packed", None, layout=layout)
            return tap((name,), "packed", f"{name} packs q, k and v in a {layout or 'unknown'} layout"
                       + ("" if layout else " (add a packed-layout data entry)")
                       + f" with {heads} query / {kv_heads} key-value heads; the q/k tap splits only "
                       f"{' or '.join(PACKED_SPLITS)} layouts with as many key-value as query heads", layout=layout)
    return tap((), None, f"no q/k projections in {type(attention).__name__} (children: {', '.join(children)})")


def _slot(owner: nn.Module, layers: str, rotaries: list[str],
          token_embeddings: nn.Module) -> tuple[str | None, nn.Module | None]:
    """The absolute position module outside the layers: a known attribute name or a *Position* class."""
    for name, module in owner.named_modules():
        if not name or name.startswith(layers + ".") or module is token_embeddings or name in rotaries:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf in SLOT_NAMES or ("position" in type(module).__name__.lower() and "rotary" not in type(module).__name__.lower()):
            return name, module
    return None, None


def _slot_offset(slot: nn.Module | None) -> int:
    """Table row of position 0: OPT-style `offset`, or RoBERTa's rows up to its padding index."""
    if slot is None:
        return 0
    padding = getattr(slot, "padding_idx", None)
    # fairseq-style sinusoids (M2M100) keep an `offset` but count rows from padding_idx + 1 in forward; XGLM's
    # names padding_idx only to rebuild its table, and adds its offset to the ids itself
    adds = source_has(type(slot).forward, ("position_ids + self.offset",))
    counts_from_padding = isinstance(padding, int) and not adds and source_has(type(slot).forward, ("padding_idx",))
    if isinstance(getattr(slot, "offset", None), int) and not counts_from_padding:
        return slot.offset
    return padding + 1 if isinstance(padding, int) else 0


def _slot_width(slot: nn.Module | None) -> int | None:
    weight = getattr(slot, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[-1])
    width = getattr(slot, "embedding_dim", None)
    return width if isinstance(width, int) else None


def _adds_offset(slot: nn.Module | None) -> bool:
    """OPT-style slots keep their offset as an attribute and add it in forward: the ids the model takes
    (and its max_position_embeddings) count from position 0."""
    return slot is not None and isinstance(getattr(slot, "offset", None), int) and slot.offset > 0 \
        and source_has(type(slot).forward, ("self.offset",))


def _has_buffer(root: nn.Module, path: str) -> bool:
    parent, _, name = path.rpartition(".")
    return _has_module(root, parent) and name in dict(root.get_submodule(parent).named_buffers(recurse=False))


def _has_module(root: nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
    except AttributeError:
        return False
    return True


def _relative(path: str, base: str) -> str:
    """`path` relative to `base` (both from the model root); `path` must lie inside `base`."""
    if path == base:
        return ""
    if base and not path.startswith(base + "."):
        return OUTSIDE + path
    return path[len(base) + 1:] if base else path


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else prefix or path
