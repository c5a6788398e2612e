"""Where positions enter a decoder, read from the model instance itself rather than from a list of
model names: the module tree, weight shapes, forward signatures, and one call of the rotary module
on three positions. All of it is static (no model forward), so a model built on the meta device
from a config alone is enough.

The result is a `Found` (`adapters.found`): the records the generic adapter is composed of, and the details
its gaps are decided from and the zoo catalog prints. Anything that looks like a position (a module, buffer or
config field) that discovery cannot place is listed in `details.unexplained`, so the adapter refuses the model
instead of patching it halfway.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from .. import compat
from . import quirks
from .base import PACKED_LAYOUTS, Blocks, Embeddings, FixedOffset, NativeBias, PositionSlot, QKTap, Rotation
from .found import Details, Found
from .probes import (MASK_BUILDERS, causal, chain, find_rotaries, native_bias, native_bias_kind, passes_kwargs,
                     rotation_off,
                     rebuild_problems, relays_kwargs, rotary_call, slot_call, source_has, takes_kwargs, unexplained)
from .quirks import (ALIBI_HEAD_DIM_POWER, MASK_ADDED_TO_LOGITS, NATIVE_BIAS_SWITCHES, ROPE_SWITCHES, ROTATION_OFF_FLAGS,
                     TRAINED_LENGTHS,
                     packed_layout, positions_field)

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
ROPE_SCHEMES = {"default": "rope", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3",
                "longrope": "longrope"}  # a native rope_type -> the scheme it is


def discover(model: nn.Module, stack: str | None = None) -> Found:
    """Read where positions enter a (causal LM) transformers model, or one stack ("encoder", "decoder") of an
    encoder-decoder model: the records of its generic adapter, which `generic.adapter_from` composes."""
    config, text = model.config, compat.text_config(model.config)
    model_type = config.model_type
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
    qk, tap_kind, tap_problem = _taps(attention, model_type, heads, kv_heads, head_dim) if attention is not None \
        else (None, None, "no self-attention module with q/k projections in any block")

    rotaries = find_rotaries(owner)
    slot, slot_module = _slot(owner, layers_path, rotaries, model.get_input_embeddings())
    table = next((n for n, _ in owner.named_modules() if n.startswith(layers_path + ".")
                  and n.rsplit(".", 1)[-1] in BIAS_TABLES), None)
    owner_to_base = _relative(names[id(owner)], names[id(base)])
    rotation, rotary = _rotation(owner, rotaries, layers_path, text, layer_types, owner_to_base, head_dim)
    if rotation_off(text, attention, ROTATION_OFF_FLAGS.get(model_type)):
        rotation = None  # its rotary module is built but never applied
    position_slot, embeddings, slot_details = _embeddings(owner, slot, slot_module, owner_to_base,
                                                          positions_field(model_type, stack), model_type)
    argument = native_bias(blocks[0] if blocks else None)
    switch = NATIVE_BIAS_SWITCHES.get(model_type)
    kind = native_bias_kind(text, argument, switched=isinstance(getattr(base, switch or "", None), bool))
    loop_params = inspect.signature(type(owner).forward).parameters
    first_block = blocks[attention_layers[0]] if attention_layers else None
    links = chain(owner, layers_path, first_block, found[attention_layers[0]]) if attention is not None else []
    passed = bool(links) and all(passes_kwargs(m) for m in links)
    # a hook on the block hands private kwargs to its one attention module (the relay, or the carry)
    one_attention = bool(links) and sum(map(holds_qk, first_block.modules())) == 1
    relayed = not passed and one_attention and relays_kwargs(links, first_block)
    interface = attention is not None and source_has(type(attention), ("ALL_ATTENTION_FUNCTIONS",))
    details = Details(
        composite=text is not config, base=names[id(base)], num_layers=len(blocks),
        attention_class=type(attention).__name__ if attention is not None else None, attention_paths=paths,
        attention_outside=tuple(n for n, m in owner.named_modules()
                                if n and not n.startswith(layers_path + ".") and holds_qk(m)),
        cross_attention=any(any(c in n for c in CROSS) for b in blocks[:1] for n, _ in b.named_modules()),
        heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden_size=getattr(text, "hidden_size", None),
        tap_kind=tap_kind, tap_problem=tap_problem, **rotary, **slot_details, native_bias_kind=kind,
        attention_interface=interface, mask_interface=source_has(inspect.getmodule(type(owner)), MASK_BUILDERS),
        private_kwargs=passed, loop_takes=tuple(p for p in ("input_ids", "position_ids", "inputs_embeds")
                                                if p in loop_params),
        layer_types=layer_types, sliding_window=getattr(text, "sliding_window", None),
        max_positions=getattr(text, embeddings.positions_field, None),
        unexplained=unexplained(base, [_join(owner_to_base, p) for p in (*rotaries, *([slot] if slot else []),
                                                                         *([table] if table else []))],
                                text, bool(rotaries), ROPE_SWITCHES.get(model_type)),
    )
    layers = Blocks(
        _join(owner_to_base, layers_path), attention_path, owner_to_base,
        None if len(attention_layers) == len(blocks) else attention_layers, relay_kwargs=relayed,
        # the carry's hook sits on the block, so the attention must be a module inside it (not XLM's list)
        carry_kwargs=not passed and not relayed and one_attention and bool(attention_path) and takes_kwargs(links[-1]),
        score_mask=not interface and model_type in MASK_ADDED_TO_LOGITS) if attention_layers else None
    bias = native_bias_record(model_type, argument, kind, _join(owner_to_base, table) if table else None, head_dim)
    return Found(model_type, native_scheme(bias, kind, rotation, details.rope_parameters, position_slot,
                                           details.slot_learned),
                 causal(text, owner), layers, position_slot, embeddings, rotation, qk, bias, details)


def native_bias_record(model_type: str, argument: str | None, kind: str | None, table: str | None,
                       head_dim: int) -> NativeBias:
    """The model's own score bias: the block argument carrying it (a bias table is zeroed where it is computed, and
    the argument then carries zeros), the attribute switching it off, the table, a native ALiBi's slope scale."""
    return NativeBias(argument=argument if kind and not table else None,
                      switch=NATIVE_BIAS_SWITCHES.get(model_type) if kind else None, table=table,
                      alibi_scale=head_dim ** ALIBI_HEAD_DIM_POWER.get(model_type, 0.0) if kind == "alibi" else 1.0)


def native_scheme(bias: NativeBias, kind: str | None, rotation: Rotation | None, rope: dict[str, Any] | None,
                  slot: PositionSlot | None, learned: bool) -> str:
    """The scheme the model was trained with, as a scheme name (`kind`: its native bias's)."""
    if kind or bias.table:
        return "alibi" if kind == "alibi" else "t5"
    if rotation:
        params = rope or {}
        if rotation.layer_types:
            params = next((v for v in params.values() if isinstance(v, dict)), {})
        return ROPE_SCHEMES.get(params.get("rope_type", "default"), params.get("rope_type", "rope"))
    if slot:
        return "learned" if learned else "sinusoidal"
    return "nope"


def _embeddings(owner: nn.Module, slot: str | None, slot_module: nn.Module | None, owner_to_base: str,
                field: str, model_type: str) -> tuple[PositionSlot | None, Embeddings, dict[str, Any]]:
    """The position slot, what the token embeddings carry besides, and what else was seen of the slot."""
    call = slot_call(slot_module) if slot_module is not None else None
    position_slot = PositionSlot(_join(owner_to_base, slot), FixedOffset(_slot_offset(slot_module)),
                                 _adds_offset(slot_module), call is not None) if slot else None
    embeddings = Embeddings(_has_buffer(owner, "embeddings.token_type_ids"),
                            tuple(_join(owner_to_base, p) for p in ("embeddings.token_type_embeddings",)
                                  if _has_module(owner, p)), field, TRAINED_LENGTHS.get(model_type))
    return position_slot, embeddings, dict(
        slot_class=type(slot_module).__name__ if slot_module is not None else None,
        slot_learned=slot_module is not None and any(p.requires_grad for p in slot_module.parameters()),
        slot_call=call,
        slot_width=_slot_width(slot_module),
    )


def _rotation(owner: nn.Module, rotaries: list[str], layers_path: str, text: Any, layer_types: tuple[str, ...] | None,
              owner_to_base: str, head_dim: int) -> tuple[Rotation | None, dict[str, Any]]:
    """The model's rotary module (the first of them), and what else was seen of its rotation."""
    in_layers = [r for r in rotaries if r.startswith(layers_path + ".")]
    rotary_modules = [owner.get_submodule(r) for r in rotaries]
    rope = getattr(text, "rope_parameters", None) or None
    rotary_types, widths, rotary_problem = rotary_call(rotary_modules[0], rope, layer_types) if rotaries else \
        ((), {}, None)
    per_type = bool(rope) and all(isinstance(v, dict) or v is None for v in rope.values())
    own_keys = set().union(*(v or {} for v in rope.values())) if per_type else set(rope or {})
    paths = tuple(_join(owner_to_base, r) for r in rotaries)
    width = next(iter(widths.values()), None)
    return Rotation(paths[0], rotary_types, width if width and width != head_dim else None) if paths else None, dict(
        rotary=paths,
        rotary_class=type(rotary_modules[0]).__name__ if rotaries else None,
        rotary_inside_layers=bool(in_layers),
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


def _taps(attention: nn.Module, model_type: str, heads: int, kv_heads: int,
          head_dim: int) -> tuple[QKTap | None, str | None, str | None]:
    """Where q and k leave their projections (None: nowhere a rotation can act), their kind, and the problem that
    keeps the q/k installer from using them (None if it can)."""
    children = dict(attention.named_children())

    def tap(names: tuple[str, ...], kind: str | None, problem: str | None, per_head: bool = False,
            layout: str | None = None, groups: int = 1) -> tuple[QKTap | None, str | None, str | None]:
        found = QKTap(names, packed=kind == "packed", per_head=per_head, layout=layout, groups=groups) \
            if names and kind != "latent" else None
        return found, kind, problem

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
            if layout in PACKED_LAYOUTS and heads % kv_heads == 0 and (layout != "per_head" or heads == kv_heads):
                return tap((name,), "packed", None, layout=layout, groups=heads // kv_heads)
            return tap((name,), "packed", f"{name} packs q, k and v in a {layout or 'unknown'} layout"
                       + ("" if layout else " (add a packed-layout data entry)")
                       + f" with {heads} query / {kv_heads} key-value heads; the q/k tap splits "
                       f"{' or '.join(PACKED_LAYOUTS)} layouts, per_head only with as many key-value as query heads",
                       layout=layout)
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

