"""patch / unpatch / describe / from_pretrained: the adapter says where, the scheme says what.

Every change a patch makes is recorded with its undo, on the instance only (no transformers class
or module global is touched), so a failed patch rolls back and `unpatch` is bit-exact.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from . import attention, compat, saving
from .adapters.base import Adapter, get_module, set_module
from .config import PosEncConfig
from .errors import PosEncError
from .registry import adapter_for, get_scheme, supported_schemes
from .schemes.base import ModelFacts, Scheme, ZeroPositions
from .schemes.relative import fit_keys
from .schemes.rope import Rotary, native_partial, rotate

STATE_ATTR = "_posenc_state"
ROTARY_KWARG = "posenc_rotary"  # private kwarg carrying (cos, sin) from the layer loop to the attention modules
ROTARY_MODULE = "posenc_rotary"  # where a q/k scheme's rotary module lives on a model that had none
_MISSING = object()


@dataclass
class PatchState:
    """What is patched now and how to take it back."""

    config: PosEncConfig
    undo: list[Callable[[], None]] = field(default_factory=list)
    new_modules: list[nn.Module] = field(default_factory=list)

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        old = getattr(obj, name, _MISSING)
        setattr(obj, name, value)
        self.undo.append(lambda: delattr(obj, name) if old is _MISSING else setattr(obj, name, old))

    def replace(self, root: nn.Module, path: str, module: nn.Module) -> None:
        old = set_module(root, path, module)
        self.undo.append(lambda: set_module(root, path, old))
        self.new_modules.append(module)

    def add_module(self, root: nn.Module, name: str, module: nn.Module, new: bool = False) -> None:
        """Attach a module; `new` marks one whose weights a checkpoint must carry."""
        root.add_module(name, module)
        self.undo.append(lambda: delattr(root, name))
        if new:
            self.new_modules.append(module)

    def hook(self, handle: torch.utils.hooks.RemovableHandle) -> None:
        self.undo.append(handle.remove)

    def set_attn_implementation(self, model: nn.Module, name: str) -> None:
        old = compat.attn_implementation(model.config)
        compat.set_attn_implementation(model, name)
        self.undo.append(lambda: compat.set_attn_implementation(model, old))

    def rollback(self) -> None:
        while self.undo:
            self.undo.pop()()


def describe(model: nn.Module) -> PosEncConfig | None:
    """The scheme patched into `model` now, with every option resolved; None if unpatched."""
    state = getattr(model, STATE_ATTR, None)
    return state.config if state is not None else None


def patch(model: nn.Module, scheme: str | PosEncConfig, **options: Any) -> nn.Module:
    """Swap the positional scheme of `model` in place and return it.

    Args:
        model: a transformers model of a supported architecture (`hf_posenc.list_architectures()`).
        scheme: a scheme name (`hf_posenc.list_schemes()`) or a `PosEncConfig`.
        **options: the scheme's options (e.g. `theta=1e4`, `factor=4.0`).
    """
    if isinstance(scheme, PosEncConfig):
        config = scheme.replace(**options) if options else scheme
    elif isinstance(scheme, str):
        config = PosEncConfig(scheme, **options)
    else:
        raise PosEncError(f"scheme must be a name or a PosEncConfig, got {type(scheme).__name__}")
    adapter = adapter_for(model)
    spec = get_scheme(config.scheme)
    if not adapter.supports(spec):
        raise PosEncError(
            f"{model.config.model_type!r} models ({adapter.name} adapter) cannot take scheme {spec.name!r}; "
            f"supported: {', '.join(supported_schemes(model))}"
        )
    previous = describe(model)
    unpatch(model)
    facts = adapter.facts(model)
    config = PosEncConfig(spec.name, **spec.resolve(config.options, facts))
    state = PatchState(config)
    try:
        _install(model, adapter, spec, facts, state)
    except BaseException:
        state.rollback()
        if previous is not None:
            patch(model, previous)
        raise
    setattr(model, STATE_ATTR, state)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Put back the model's own positional scheme; logits become bit-identical to before `patch`."""
    state = getattr(model, STATE_ATTR, None)
    if state is not None:
        state.rollback()
        delattr(model, STATE_ATTR)
    return model


def _install(model: nn.Module, adapter: Adapter, spec: Scheme, facts: ModelFacts, state: PatchState) -> None:
    base, config, options = model.base_model, model.config, state.config.options
    offset = adapter.position_offset(config)
    state.set_attr(config, "posenc", state.config.to_dict(original=adapter.native))
    # the folders it saves load back patched, never as the stock model (saving.py)
    model.save_pretrained = functools.partial(saving.save_pretrained, model)
    state.undo.append(functools.partial(delattr, model, "save_pretrained"))
    if (max_positions := spec.max_positions(options)) is not None:
        state.set_attr(config, "max_position_embeddings", max_positions + offset)

    added = None  # an input-site code the layer-loop hook adds to the token embeddings
    code = spec.module(options, facts) if spec.site == "input" else None
    if adapter.position_slot:
        state.replace(base, adapter.position_slot, code or ZeroPositions(facts.dtype).to(facts.device))
    elif code is not None:
        state.add_module(base, "posenc_positions", code, new=True)
        added = code
    if notes := getattr(code, "notes", None):
        config.posenc["notes"] = notes
    if code is not None and hasattr(code, "project_tokens"):  # concat: tokens keep their own subspace
        for embedding in (model.get_input_embeddings(), *(get_module(base, p) for p in adapter.other_embeddings)):
            state.hook(embedding.register_forward_hook(lambda mod, args, out: code.project_tokens(out)))

    rotary = None
    if spec.site == "qk":
        native = adapter.rotary is not None and spec.native
        if native and options["partial"] == native_partial(facts):
            # Natively rotating model: scaling is config; plain transformers reloads it.
            params = spec.rope_parameters(options, facts)
            own = compat.rope_parameters(config) or {}
            if "partial_rotary_factor" in own:
                params["partial_rotary_factor"] = own["partial_rotary_factor"]
            state.set_attr(config, "rope_parameters", params)
            old = get_module(base, adapter.rotary)
            state.replace(base, adapter.rotary, type(old)(config=config).to(facts.device))
        elif native:
            rotary_module = spec.rotary(options, facts, config.max_position_embeddings).to(facts.device)
            state.replace(base, adapter.rotary, rotary_module)
        else:
            rotary = spec.rotary(options, facts, config.max_position_embeddings).to(facts.device)
    if adapter.rotary and (spec.site != "qk" or rotary is not None):
        # Switch the model's own rotation off: cos=1, sin=0 everywhere.
        state.replace(base, adapter.rotary, Rotary(facts.head_dim, {}, 0.0, facts.max_positions))

    bias = scores = None
    if spec.site in ("score", "attention"):
        state.set_attn_implementation(model, attention.implementation_for(compat.attn_implementation(config)))
    if spec.site == "score" and spec.learned:
        bias = spec.module(options, facts).to(facts.device)
        state.add_module(base, "posenc_bias", bias, new=True)
    if spec.site == "attention":
        scores = spec.module(options, facts).to(facts.device)
        state.add_module(base, "posenc_attention", scores)

    if rotary is not None:
        state.add_module(base, ROTARY_MODULE, rotary)
        for module in adapter.attention_modules(model):
            _tap_queries_and_keys(module, adapter, facts.head_dim, state)

    if adapter.position_slot or added is not None or rotary is not None or spec.site in ("score", "attention"):
        hook = _layer_loop_hook(model, adapter, offset, added, rotary, bias, scores,
                                guard=spec.site in ("score", "attention"))
        state.hook(base.register_forward_pre_hook(hook, with_kwargs=True))


def _positions(kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, q) positions of the new tokens and (B, k) of all keys so far: counted over the padding
    mask when there is one, so a left-padded row sees the same positions as the prompt alone."""
    ids = kwargs.get("input_ids")
    ref = ids if ids is not None else kwargs["inputs_embeds"][..., 0]
    batch, length = ref.shape[:2]
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:  # not a prepared 4D mask or a per-layer-type dict
        keys = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return keys[:, -length:], keys
    cache = kwargs.get("past_key_values")
    past = cache.get_seq_length() if cache is not None else 0
    keys = torch.arange(past + length, device=ref.device).expand(batch, -1)
    return keys[:, past:], keys


def _layer_loop_hook(model: nn.Module, adapter: Adapter, offset: int, added: nn.Module | None,
                     rotary: nn.Module | None, bias: nn.Module | None, scores: nn.Module | None,
                     guard: bool) -> Callable:
    """Pre-hook on the module owning the layer loop. Once per forward it fills in padding-aware
    position_ids, adds slot-less input codes, and computes (cos, sin) and learned-bias closures that
    travel down as private kwargs (not as position_ids, which transformers would read as packed
    sequences when they do not step by one)."""
    names = list(inspect.signature(model.base_model.forward).parameters)

    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        kwargs = {**dict(zip(names, args)), **kwargs}
        if guard and not compat.attn_implementation(module.config).startswith(attention.PREFIX):
            raise PosEncError(
                f"attention implementation was switched to {compat.attn_implementation(module.config)!r} after "
                f"patching, which drops the {module.config.posenc['scheme']!r} scheme; set it back with "
                "model.set_attn_implementation('posenc_sdpa' or 'posenc_eager'), or patch again"
            )
        positions, key_positions = _positions(kwargs)
        if kwargs.get("position_ids") is not None:
            positions = kwargs["position_ids"] - offset
        elif adapter.position_slot:
            kwargs["position_ids"] = positions + offset
        if adapter.token_type_ids and kwargs.get("token_type_ids") is None:
            # The stock zero buffer is indexed by position and would overflow past the old table.
            kwargs["token_type_ids"] = torch.zeros_like(positions).expand(kwargs["position_ids"].shape[0], -1)
        if added is not None:
            if kwargs.get("inputs_embeds") is None:
                kwargs["inputs_embeds"] = model.get_input_embeddings()(kwargs.pop("input_ids"))
                kwargs["input_ids"] = None
            kwargs["inputs_embeds"] = kwargs["inputs_embeds"] + added(positions)
        if rotary is not None:
            kwargs[ROTARY_KWARG] = rotary(torch.empty(0, device=positions.device), positions)
        if bias is not None:
            kwargs[attention.BIAS_KWARG] = functools.partial(bias, positions, key_positions)
        if scores is not None:
            kwargs[attention.SCORES_KWARG] = functools.partial(_scores, scores, positions, key_positions)
        return (), kwargs

    return hook


def _scores(module: nn.Module, q_pos: torch.Tensor, k_pos: torch.Tensor, query: torch.Tensor,
            key: torch.Tensor) -> torch.Tensor:
    return module.scores(query, key, q_pos, fit_keys(k_pos, key.shape[-2]))


class _Tap:
    """Carries one attention call's rotation from the attention pre-hook to its projection hooks."""

    rotation: tuple[torch.Tensor, ...] | None = None


def _tap_queries_and_keys(module: nn.Module, adapter: Adapter, head_dim: int, state: PatchState) -> None:
    """Rotate q and k as they leave their projections, i.e. before the KV cache stores k. A third
    rotation tensor (xPos) scales q up and k down."""
    tap = _Tap()

    def take_rotation(mod: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if ROTARY_KWARG not in kwargs:
            raise PosEncError("rotary positions missing: a patched attention module was called outside its model")
        kwargs = dict(kwargs)
        tap.rotation = kwargs.pop(ROTARY_KWARG)
        return args, kwargs

    def transform(x: torch.Tensor, role: str) -> torch.Tensor:
        cos, sin, *scale = tap.rotation
        heads = x if adapter.qk.per_head else x.unflatten(-1, (-1, head_dim))
        out = rotate(heads, cos, sin)
        if scale:
            factor = scale[0] if role == "q" else scale[0].reciprocal()
            out = (out.float() * factor[:, :, None]).to(x.dtype)
        return out if adapter.qk.per_head else out.flatten(-2)

    def packed_hook(mod: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        q, k, v = output.chunk(3, dim=-1)
        return torch.cat((transform(q, "q"), transform(k, "k"), v), dim=-1)

    state.hook(module.register_forward_pre_hook(take_rotation, with_kwargs=True))
    if adapter.qk.packed:
        (name,) = adapter.qk.projections
        state.hook(get_module(module, name).register_forward_hook(packed_hook))
    else:
        for name, role in zip(adapter.qk.projections, ("q", "k")):
            hook = functools.partial(lambda role, mod, inputs, output: transform(output, role), role)
            state.hook(get_module(module, name).register_forward_hook(hook))


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Loading a patched checkpoint into the stock class reports the patch's keys as missing or
    unexpected; they are loaded right after, so the report would only mislead."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _checkpoint_files(path: str, **hub_kwargs: Any) -> list[str]:
    if os.path.isdir(path):
        folder = path
    else:
        from huggingface_hub import snapshot_download

        keep = {k: hub_kwargs[k] for k in ("revision", "token", "cache_dir") if k in hub_kwargs}
        folder = snapshot_download(path, allow_patterns=["*.safetensors", "*.json"], **keep)
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise PosEncError(f"no *.safetensors weights in {path!r}; save with model.save_pretrained(dir)")
    return files


def from_pretrained(path: str, model_cls: Any = None, **kwargs: Any) -> nn.Module:
    """Load a model saved after `patch`, with its positional scheme and the scheme's weights.

    Plain `from_pretrained` would silently return the unpatched architecture with the new position
    weights dropped; this re-applies `config.posenc` and then loads those weights.

    Args:
        path: a local folder or Hub repo id.
        model_cls: the transformers Auto class or model class (default `AutoModelForCausalLM`).
        **kwargs: passed to `model_cls.from_pretrained` (dtype, attn_implementation, revision, ...).
    """
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model_cls = model_cls or AutoModelForCausalLM
    with _quiet_transformers():
        model = model_cls.from_pretrained(path, **kwargs)
    posenc = getattr(model.config, "posenc", None)
    if posenc is None:
        return model
    if hasattr(model.config, "auto_map"):
        # A pushed repo's remote-code pointer; the model is patched here, and a later save_pretrained
        # would otherwise point at a file its folder does not have.
        del model.config.auto_map
    patch(model, PosEncConfig.from_dict(posenc))
    names = {id(m): n for n, m in model.named_modules()}
    wanted = {
        f"{names[id(m)]}.{key}": tensor
        for m in describe_modules(model)
        for key, tensor in m.state_dict().items()
    }
    if wanted:
        # a bare base model loaded from a checkpoint saved with a head: keys carry the base prefix
        prefixed = {f"{model.base_model_prefix}.{key}": key for key in wanted}
        found: dict[str, torch.Tensor] = {}
        for file in _checkpoint_files(path, **kwargs):
            with safe_open(file, framework="pt") as handle:
                for key in handle.keys():
                    if key in wanted or key in prefixed:
                        found[prefixed.get(key, key)] = handle.get_tensor(key)
        if missing := sorted(set(wanted) - set(found)):
            raise PosEncError(f"{path!r} lacks the weights of its {posenc['scheme']!r} patch: {', '.join(missing)}")
        with torch.no_grad():
            for key, tensor in found.items():
                wanted[key].copy_(tensor)
    return model


def describe_modules(model: nn.Module) -> list[nn.Module]:
    """The modules the current patch installed that carry weights or saved buffers (what a recipe
    should train and a checkpoint must hold)."""
    state = getattr(model, STATE_ATTR, None)
    return [m for m in state.new_modules if m.state_dict()] if state is not None else []
