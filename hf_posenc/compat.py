"""The only module that knows which transformers version is installed.

Everything that reaches into transformers internals (rotary classes, RoPE init functions,
attention/mask interfaces, attention implementation switching, cache layers) goes through here, and
the one piece of peft's layout the patch needs (what runs inside a `modules_to_save` wrapper).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
import warnings

from typing import Any, Callable, Collection, Iterator

import torch
import transformers
from packaging.version import Version

# The lowest transformers the package declares (pyproject) and CI runs the fast matrix on (`make test`
# builds a second venv with it, Makefile MIN_TRANSFORMERS); tests/test_version.py keeps the three equal.
MIN_TRANSFORMERS = "5.0.0"
# The newest transformers the whole suite passed on (what `make test`'s main venv resolved; tests/test_version.py
# keeps it equal to the installed version there). Past it, patch() runs hf_posenc.self_check first.
TESTED_THROUGH = "5.24.0"
# The other libraries a patched model meets, as (lowest declared in pyproject, newest the suite passed on);
# `hf-posenc doctor` reports the installed versions against them.
TESTED_RANGES = {"transformers": (MIN_TRANSFORMERS, TESTED_THROUGH), "peft": ("0.13", "0.21.2"),
                 "accelerate": ("1.0", "1.15.0")}


def within(version: str, low: str, high: str) -> bool:
    """`low <= version <= high` as releases compare (a local build's +suffix is ignored)."""
    return Version(low) <= Version(Version(version).base_version) <= Version(high)


def check_transformers(version: str) -> None:
    """Refuse an older transformers by name before any of its internals are imported (they moved in 5)."""
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise ImportError(f"hf-posenc needs transformers>={MIN_TRANSFORMERS}, found {version}; "
                          f"upgrade with: pip install -U 'transformers>={MIN_TRANSFORMERS}'")


check_transformers(transformers.__version__)

from transformers import PretrainedConfig  # noqa: E402
from transformers.cache_utils import Cache, StaticLayer, StaticSlidingWindowLayer  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface  # noqa: E402

__all__ = [
    "ROPE_INIT_FUNCTIONS",
    "FollowRows",
    "RECORD_ATTR",
    "attn_implementation",
    "base_attention_function",
    "known_attention",
    "base_mask_function",
    "cache_length",
    "checkpoint_key_renamer",
    "load_report_held",
    "log_load_report",
    "record_positions",
    "recorded_positions",
    "static_length",
    "static_record",
    "static_slots",
    "register_attention",
    "rope_parameters",
    "rotary_config",
    "rederive_rotary",
    "rotary_module_class",
    "dense_gguf_kwargs",
    "encoder_module",
    "running_module",
]


def rotary_module_class() -> type[torch.nn.Module]:
    """transformers' reference rotary module; its RoPE-type dispatch works for any config."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding


@torch.no_grad()
def rederive_rotary(module: torch.nn.Module) -> None:
    """Compute a transformers rotary module's frequencies again from its config, in place (its init does it; the
    model's `init_weights` does not on transformers 5.0, so a model built on the meta device had them empty)."""
    init = ROPE_INIT_FUNCTIONS.get(module.rope_type, module.compute_default_rope_parameters)
    inv_freq, _ = init(module.config)
    for name in ("inv_freq", "original_inv_freq"):
        if isinstance(getattr(module, name, None), torch.Tensor):
            getattr(module, name).copy_(inv_freq)


# The rope_parameters keys of transformers' common RoPE types; any other key is a model's own (GPT-OSS's
# `truncate`, Ministral 3's `llama_4_scaling_beta`) and stays when a patch writes new rope_parameters
# (`type` is the legacy name of `rope_type`).
ROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
             "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "low_freq_factor",
             "high_freq_factor", "short_factor", "long_factor"}


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config holding the text decoder's settings: a sub-config in multimodal wrappers (Fuyu, GOT-OCR2)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def rope_parameters(config: PretrainedConfig) -> dict[str, Any] | None:
    """The model's own RoPE parameters (v5 `rope_parameters`), or None if it does not rotate."""
    params = getattr(config, "rope_parameters", None)
    return dict(params) if params else None


def rotary_config(
    *, head_dim: int, max_position_embeddings: int, rope_parameters: dict[str, Any]
) -> PretrainedConfig:
    """A minimal config that transformers' rotary module and ROPE_INIT_FUNCTIONS accept."""
    config = PretrainedConfig()
    config.head_dim = head_dim
    config.hidden_size = head_dim
    config.num_attention_heads = 1
    config.max_position_embeddings = max_position_embeddings
    config.rope_parameters = dict(rope_parameters)
    return config


def with_head_dim(config: PretrainedConfig) -> PretrainedConfig:
    """`config`, or a copy of it with head_dim = hidden_size // heads where it names none: Hub configs
    (Mixtral-8x7B's) omit it and some RoPE init functions (YaRN's) multiply it without the fallback."""
    if getattr(config, "head_dim", None) or not getattr(config, "num_attention_heads", None):
        return config
    config = copy.deepcopy(config)
    config.head_dim = config.hidden_size // config.num_attention_heads
    return config


def attn_implementation(config: PretrainedConfig) -> str:
    return config._attn_implementation


def known_attention(name: str) -> bool:
    """Whether transformers knows `name` as an attention implementation (eager is each model's own)."""
    return name == "eager" or name in ALL_ATTENTION_FUNCTIONS


def base_attention_function(name: str) -> Callable | None:
    """The stock attention function registered under `name` (None for 'eager', which is per model)."""
    if name == "eager":
        return None
    return ALL_ATTENTION_FUNCTIONS[name]


def base_mask_function(name: str) -> Callable:
    return ALL_MASK_ATTENTION_FUNCTIONS[name]


def register_attention(name: str, attention: Callable, mask: Callable) -> None:
    """Register under a new implementation name with BOTH interfaces.

    With only the attention interface registered, transformers builds no mask at all and
    padding is silently ignored (seen on 5.x).
    """
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)


def dense_gguf_kwargs(gguf_file: str) -> dict[str, Any]:
    """`from_pretrained` kwargs that unpack a GGUF file into plain dense weights.

    Left packed (or dequantized under the legacy loader, which keeps its quantizer), the model
    refuses `save_pretrained`; asked to dequantize, transformers drops the quantizer itself.
    """
    from transformers.utils.quantization_config import GgufConfig

    return {"gguf_file": gguf_file, "quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}


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
    return layer.cumulative_length.to(device)


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


def running_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module that actually runs in place of `module`: peft's `modules_to_save` wrapper runs its
    active trainable copy (the original stays inside, untouched)."""
    copies = getattr(module, "modules_to_save", None)
    active = getattr(module, "active_adapters", None)
    if isinstance(copies, torch.nn.ModuleDict) and active and active[0] in copies and not module.disable_adapters:
        return copies[active[0]]
    return module


def encoder_module(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's encoder side as a module of its own: `get_encoder()` (a text encoder, or a speech model's
    `encoder`), else its audio tower (`get_encoder(modality="audio")`, transformers 5: speech LMs that feed audio
    frames into a decoder-only LM); None when both return the model itself."""
    own = [model, getattr(model, "base_model", model)]
    found = model.get_encoder()
    if any(found is m for m in own):
        try:
            found = model.get_encoder(modality="audio")
        except TypeError:  # a model's own get_encoder() without the modality argument
            return None
    return None if any(found is m for m in own) else found


def checkpoint_key_renamer(model: torch.nn.Module, keys: Collection[str]) -> Callable[[str], str]:
    """A checkpoint file's key -> the model's own name among `keys`, as transformers 5's loading renames it: the
    model's renamings on save and load (Qwen2-Audio saves `language_model.model.*` for `model.language_model.*`),
    then the base model's prefix added or taken off, so that a checkpoint saved with a head loads into the base
    model and one saved from the base model into a model with a head."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    renames = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""

    def rename(key: str) -> str:
        if key in keys:
            return key
        for transform in renames:
            key = transform.rename_source_key(key)[0]
        if prefix and key.startswith(prefix) and key[len(prefix):] in keys:
            return key[len(prefix):]
        if prefix and key not in keys and prefix + key in keys:
            return prefix + key
        return key

    return rename


LOAD_LOGGER = "transformers.modeling_utils"  # where transformers logs what a load left missing, unexpected or mismatched
# how transformers 5 heads that one warning: "<Class> LOAD REPORT from ..." (some earlier 5.x: "State-dict loading
# report for <Class> ...")
LOAD_REPORTS = ("load report", "loading report")


@contextlib.contextmanager
def load_report_held() -> Iterator[None]:
    """While a model loads, hold back transformers' load report and let every other message through; a load that
    fails logs it after all (the error points at it)."""
    logger = logging.getLogger(LOAD_LOGGER)
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if any(words in record.getMessage().lower() for words in LOAD_REPORTS):
            held.append(record)
            return False
        return True

    logger.addFilter(hold)
    try:
        yield
    except BaseException:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)
        raise
    finally:
        logger.removeFilter(hold)


def log_load_report(model: torch.nn.Module, source: str, info: dict[str, Any], note: str) -> None:
    """Log a load report from `from_pretrained(..., output_loading_info=True)`'s `info` where transformers logs its
    own (its verbosity decides), in its words; `note` says what was left out of it."""
    lines = [f"{type(model).__name__} LOAD REPORT from: {source} ({note})"]
    if info["missing_keys"]:
        lines.append(f"- MISSING, newly initialized: {', '.join(sorted(info['missing_keys']))}")
    if info["unexpected_keys"]:
        lines.append(f"- UNEXPECTED, not loaded: {', '.join(sorted(info['unexpected_keys']))}")
    for entry in sorted(info["mismatched_keys"], key=str):
        key, *shapes = entry if isinstance(entry, tuple) else (entry,)
        sizes = f" - ckpt: {tuple(shapes[0])} vs model: {tuple(shapes[1])}" if len(shapes) == 2 else ""
        lines.append(f"- MISMATCH: {key} (Reinit due to size mismatch{sizes})")
    if len(lines) > 1:
        logging.getLogger(LOAD_LOGGER).warning("\n".join(lines))


def get_peft_model(model: torch.nn.Module, config: Any) -> Any:
    """peft's `get_peft_model`, without the FutureWarning transformers 5.24 raises when peft (0.21) reads the
    deprecated `is_gradient_checkpointing` it calls on our behalf."""
    import peft

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return peft.get_peft_model(model, config)
