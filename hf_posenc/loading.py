"""Every read: the one way to get a model, its config and its tokenizer from a name, a folder or a Hub id.

Used by every command and by the remote-code file of published repos, so a model loads the same
everywhere: names of package-shipped models (`smollm2`, `minilm`, see `hf_posenc.models`) resolve
to their folders; GGUF files are unpacked into plain dense weights, so the model saves like any
other; every checkpoint goes through `from_pretrained` (= `hf_posenc.from_pretrained`), which reads every
folder layout `hf_posenc.writing` has written (`read_config`) and re-applies a saved patch before its
weights load (plain `from_pretrained` silently drops it); the model class follows the task. A read that
fails says which (`failed`, `damaged`).
"""

from __future__ import annotations

import contextlib
import copy
import glob
import json
import os
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from . import compat
from .catalog import get_scheme
from .config import BEFORE, PosEncConfig
from .errors import PosEncError
from .models import NAMED_MODELS, recorded_config, source
from .patching import describe_modules, patch
from .writing import HUB_KWARGS, LEGACY_MODEL_TYPE, MODEL_TYPE, STOCK_MODEL_TYPE, stock_architectures, stock_model_type
from .state import STATE_ATTR
from .unpacked import cached_folder, unpacked_folder

__all__ = ["TASK_MODEL_CLASSES", "damaged", "failed", "from_pretrained", "has_own_model_type", "inference_device_map", "load",
           "config_only", "load_config", "load_model", "load_tokenizer", "model_class", "read_config"]

# task -> Auto class; "saved" is the class the checkpoint was saved as (its stock `architectures`).
TASK_MODEL_CLASSES: dict[str, Any] = {
    "causal_lm": transformers.AutoModelForCausalLM,
    "classification": transformers.AutoModelForSequenceClassification,
    "masked_lm": transformers.AutoModelForMaskedLM,
    "seq2seq": transformers.AutoModelForSeq2SeqLM,
    "base": transformers.AutoModel,
    "saved": None,
}


def failed(name_or_path: str, what: str, err: Exception) -> PosEncError:
    """The error of a read that failed: what could not be read, why, and what to give instead (never the name
    that just failed: a packaged model that does not load is reinstalled)."""
    if name_or_path in NAMED_MODELS:
        return PosEncError(f"cannot load the {what} of the packaged model {name_or_path!r} ({type(err).__name__}: "
                           f"{err}); reinstall it with `{NAMED_MODELS[name_or_path][4]}`")
    others = [name for name in NAMED_MODELS if name != name_or_path]
    return PosEncError(f"cannot load the {what} of {name_or_path!r} ({type(err).__name__}: {err}); give a saved "
                       f"model folder, a reachable Hub id or one of {', '.join(others)}")


def load_config(name_or_path: str) -> PretrainedConfig:
    """The config alone (cheap): enough to check what a model supports before its weights load."""
    path, kwargs = source(name_or_path)
    if (recorded := recorded_config(name_or_path, path)) is not None:  # a packaged GGUF's, without parsing it
        config = CONFIG_MAPPING[recorded["model_type"]].from_dict(recorded)
        config._name_or_path = path  # as from_pretrained sets it
        return config
    try:
        return read_config(path, **kwargs)
    except (OSError, ValueError) as err:
        raise failed(name_or_path, "config", err) from None


def model_class(name_or_path: str, task: str, config: PretrainedConfig | None = None) -> Any:
    """The transformers class for a task; "saved" reads it from the config (GGUF files, which name
    none, hold causal LMs)."""
    if task not in TASK_MODEL_CLASSES:
        raise PosEncError(f"unknown task {task!r}; choose one of {', '.join(TASK_MODEL_CLASSES)}")
    if TASK_MODEL_CLASSES[task] is not None:
        return TASK_MODEL_CLASSES[task]
    name = (stock_architectures(config or load_config(name_or_path)) or [""])[0]
    return getattr(transformers, name, None) or transformers.AutoModelForCausalLM


def inference_device_map(device: torch.device | None = None) -> str | dict[str, torch.device] | None:
    """Where a model loaded for inference puts its weights (`load_model(..., device_map=...)`).

    `device` given (one process of a multi-process evaluation): a whole copy on it, or None for the
    CPU. Otherwise "auto" when an accelerator is present, so a model larger than one device is
    spread over the devices (and offloaded past their memory) by accelerate; None on a CPU-only
    machine, which loads as transformers does by default. Training never uses this: accelerate
    places the model there.
    """
    if device is not None:
        return None if device.type == "cpu" else {"": device}
    return "auto" if torch.accelerator.current_accelerator() is not None else None


def load_model(
    name_or_path: str,
    *,
    task: str = "causal_lm",
    dtype: torch.dtype | None = None,
    scheme: str | None = None,
    options: dict[str, Any] | None = None,
    config: PretrainedConfig | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """A model in eval mode, patched as it was saved, then with `scheme` if given.

    Args:
        name_or_path: a name from `hf_posenc.models.NAMED_MODELS`, a local folder or a Hub id.
        task: a key of `TASK_MODEL_CLASSES`: the head to load ("saved": the class the checkpoint names).
        dtype: parameter dtype (GGUF weights are unpacked to it); None leaves transformers' default.
        scheme: apply `hf_posenc.patch(model, scheme, **options)` after loading.
        options: the scheme's options.
        config: an already loaded config (the remote-code entry point gets one from transformers).
        **kwargs: passed to `from_pretrained` (attn_implementation, num_labels, revision,
            device_map (see `inference_device_map`), ...).
    """
    path, source_kwargs = source(name_or_path)
    if name_or_path in NAMED_MODELS:  # a GGUF is read from its unpacked copy (unpacked once, then cached)
        path, source_kwargs = str(unpacked_folder(name_or_path)), {}
    cls = model_class(name_or_path, task, config)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if config is not None:
        kwargs["config"] = config
    try:
        model = from_pretrained(path, model_cls=cls, **source_kwargs, **kwargs)
    except PosEncError:
        raise
    except (OSError, ValueError) as err:
        raise failed(name_or_path, "weights", err) from None
    except SafetensorError as err:
        raise PosEncError(f"{damaged(path) or path}: cannot read the weights ({err}): the file is damaged or "
                          "incomplete; save or download the model again") from None
    if scheme is not None:
        patch(model, scheme, **(options or {}))
    return model.eval()


def damaged(folder: str) -> str | None:
    """The first weights file of a local folder whose safetensors header does not read."""
    for file in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(file, framework="pt"):
                pass
        except SafetensorError:
            return str(file)
    return None


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder, Hub id or packaged name (from the unpacked copy once there is one:
    reading it out of the GGUF takes 8-15 s)."""
    path, kwargs = source(name_or_path)
    if name_or_path in NAMED_MODELS and (cached := cached_folder(name_or_path)) is not None:
        path, kwargs = str(cached), {}
    extra = {k: v for k, v in kwargs.items() if k == "gguf_file"}
    if has_own_model_type(path):  # AutoTokenizer reads the model config first: give it the stock one
        extra["config"] = read_config(path)
    try:
        return transformers.AutoTokenizer.from_pretrained(path, **extra)
    except (OSError, ValueError) as err:
        raise failed(name_or_path, "tokenizer", err) from None


def load(name_or_path: str, *, tokenizer: str | None = None, **kwargs: Any
         ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer): `load_model(name_or_path, **kwargs)` and the tokenizer saved with it (or `tokenizer`)."""
    return load_model(name_or_path, **kwargs), load_tokenizer(tokenizer or name_or_path)


def has_own_model_type(folder: str | os.PathLike) -> bool:
    """Whether a local folder's config.json has hf-posenc's model_type (transformers' Auto classes,
    AutoTokenizer included, then need `trust_remote_code=True` or a config passed in)."""
    path = Path(folder) / "config.json"
    return path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("model_type") == MODEL_TYPE


def _stock_dict(config: dict[str, Any]) -> dict[str, Any]:
    """A marked config.json as transformers' stock config class reads it."""
    config = copy.deepcopy(config)
    stock = stock_model_type(config)
    if stock is None:
        raise PosEncError(f"config.json has model_type {MODEL_TYPE!r} but no posenc.{STOCK_MODEL_TYPE}: it was not "
                          "written by hf-posenc; save the model again with model.save_pretrained")
    for key in (STOCK_MODEL_TYPE, LEGACY_MODEL_TYPE):
        config["posenc"].pop(key, None)
    config["model_type"] = stock
    return config


def read_config(path: str | os.PathLike, **kwargs: Any) -> Any:
    """The stock transformers config of a saved folder, Hub repo or GGUF file, in any layout,
    with `config.posenc`; behaves as `AutoConfig.from_pretrained(path, **kwargs)` otherwise
    (`return_unused_kwargs=True` returns (config, unused kwargs)). `architectures` stay as written:
    an engine reads this config (AutoConfig with `trust_remote_code=True`) and must see hf-posenc's
    names; `stock_architectures` gives the classes behind them."""
    kwargs.pop("trust_remote_code", None)  # the stock classes need none
    config, unused = transformers.PretrainedConfig.get_config_dict(path, **kwargs)
    if config.get("model_type") != MODEL_TYPE:
        return transformers.AutoConfig.from_pretrained(path, **kwargs)
    config = _stock_dict(config)
    if config["model_type"] not in CONFIG_MAPPING:
        raise PosEncError(f"{path} holds a {config['model_type']!r} model, which this transformers "
                          f"{transformers.__version__} does not know; upgrade transformers")
    return CONFIG_MAPPING[config["model_type"]].from_dict(config, **unused)


def config_only(config: dict[str, Any]) -> bool:
    """Whether a saved config.json's patch is config-only: plain transformers rebuilds the patched model from the
    config alone (folders written before the marks existed); the model is patched on the meta device, so nothing is
    allocated."""
    posenc = config.get("posenc")
    if not posenc or config.get("model_type") == MODEL_TYPE:
        return False
    spec = get_scheme(posenc["scheme"])
    if not getattr(spec, "config_only", False):  # only a rotation `rope_parameters` says in full
        return False
    stock = CONFIG_MAPPING[config["model_type"]].from_dict({k: v for k, v in config.items() if k != "auto_map"})
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(stock)
    patch(model, PosEncConfig.from_dict(posenc))
    return getattr(model, STATE_ATTR).config_only


def from_pretrained(path: str | os.PathLike, model_cls: Any = None, **kwargs: Any) -> Any:
    """Load a model saved after `patch`, with its positional scheme and the scheme's weights.

    Plain `from_pretrained` of a patched folder either refuses it (a scheme transformers cannot
    express) or needs `trust_remote_code=True`; this reads every layout hf-posenc has written and
    re-applies `config.posenc` before the patch's weights load.

    Args:
        path: a local folder, a Hub repo id, or the name of a packaged model (`smollm2`, `minilm`, `gemma3-270m`,
            see `hf_posenc.models.NAMED_MODELS`), which loads offline: a GGUF one from its copy unpacked once
            into the user's cache (`hf_posenc.unpacked`).
        model_cls: the transformers Auto class or model class (default `AutoModelForCausalLM`).
        **kwargs: passed to `model_cls.from_pretrained` (dtype, attn_implementation, revision, ...);
            `output_loading_info=True` returns (model, its load report without the patch's own keys).
    """
    kwargs = compat.without_handoff_kwargs(kwargs)  # remote code calls this with what its Auto class added
    if str(path) in NAMED_MODELS:
        path = str(unpacked_folder(str(path)))
    config = kwargs.pop("config", None)
    if config is None:
        # as transformers' Auto classes do: the config takes its kwargs, the model the rest and the dtype
        # the dtype stays a loading argument: a config given dtype="auto" would keep the string
        dtypes = {k: kwargs.pop(k) for k in ("dtype", "torch_dtype") if k in kwargs}
        try:
            config, rest = read_config(path, return_unused_kwargs=True, **kwargs)
        except PosEncError:
            raise
        except (OSError, ValueError) as err:  # no config.json, or not one transformers reads
            raise failed(str(path), "config", err) from None
        kwargs = {**{k: kwargs[k] for k in HUB_KWARGS if k in kwargs}, **dtypes, **rest}
    else:
        config = copy.deepcopy(config)
    # the model built here is the stock class, patched: its config names that class, as transformers' own would
    stock = stock_architectures(config)
    if stock:
        config.architectures = stock
    if hasattr(config, "auto_map"):
        del config.auto_map  # the model is patched here; remote code would only call back into this function
    return _load_patched(path, model_cls, config=config, **kwargs)


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


def _before_the_patch(config: PretrainedConfig, where: str) -> None:
    """A config-only folder's config holds the patched fields; set them back to what they were before the patch
    (`recording.record_before`), so the model is built stock, patched, and `unpatch` gives the stock back."""
    before = config.posenc.get(BEFORE) if isinstance(config.posenc, dict) else None
    if before is None:
        return
    text = compat.text_config(config)
    if not isinstance(before, dict) or any(not hasattr(text, name) for name in before):
        raise PosEncError(f"{where} maps the config's fields to their values before the patch; got {before!r:.120}")
    for name, value in before.items():
        setattr(text, name, copy.deepcopy(value))


def _load_patched(path: str, model_cls: Any = None, **kwargs: Any) -> Any:
    """`model_cls.from_pretrained` with `config` (the stock class's, with `posenc`), then the patch and its weights:
    transformers alone would drop the weights of modules the stock class does not have. Its load report comes
    after the patch, without the keys the patch accounts for (`output_loading_info=True` returns it too)."""
    model_cls = model_cls or transformers.AutoModelForCausalLM
    if not callable(getattr(model_cls, "from_pretrained", None)):
        raise PosEncError(f"model_cls takes a transformers Auto class or model class (e.g. "
                          f"transformers.AutoModelForCausalLM, not a string), got {model_cls!r}")
    asked = kwargs.pop("output_loading_info", False)
    config = kwargs.get("config")
    posenc = getattr(config, "posenc", None)
    if posenc is not None:  # refused before any weight loads
        PosEncConfig.from_dict(posenc, where=f"{path}: config.json's posenc")
        _before_the_patch(config, f"{path}: config.json's posenc.{BEFORE}")
    try:
        with compat.load_report_held() if posenc is not None else contextlib.nullcontext():
            model, info = model_cls.from_pretrained(path, output_loading_info=True, **kwargs)
    except SafetensorError as err:
        where = damaged(str(path)) if os.path.isdir(path) else None
        raise PosEncError(f"{where or path}: cannot read the weights ({err}): the file is damaged or incomplete; "
                          "save or download the model again") from None
    except OSError as err:  # no weights file, no config.json, not a folder nor a Hub id
        raise failed(str(path), "weights", err) from None
    if posenc is not None:
        info = _load_the_patch(model, path, info, **kwargs)
    return (model, info) if asked else model


def _load_the_patch(model: nn.Module, path: str, info: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Patch a model loaded stock with its `config.posenc` and load the patch's weights; log transformers' load
    `info` without the keys the patch accounts for (its weights, the stock positions it took out), and return it."""
    posenc = model.config.posenc
    if hasattr(model.config, "auto_map"):
        # A pushed repo's remote-code pointer; the model is patched here, and a later save_pretrained
        # would otherwise point at a file its folder does not have.
        del model.config.auto_map
    stock = set(model.state_dict())
    patched = PosEncConfig.from_dict(posenc, where=f"{path}: config.json's posenc")
    patch(model, patched)
    names = {id(m): n for n, m in model.named_modules()}
    wanted = {
        f"{names[id(m)]}.{key}": tensor
        for m in describe_modules(model)
        for key, tensor in m.state_dict().items()
    }
    # a base model from a checkpoint saved with a head, or the other way round: the renamer bridges the prefix
    renamed = compat.checkpoint_key_renamer(model, wanted)
    if wanted:
        found: dict[str, torch.Tensor] = {}
        for file in _checkpoint_files(path, **kwargs):
            with safe_open(file, framework="pt") as handle:
                for stored in handle.keys():
                    if (key := renamed(stored)) in wanted:
                        found[key] = handle.get_tensor(stored)
        if missing := sorted(set(wanted) - set(found)):
            raise PosEncError(f"{path!r} lacks the weights of its {patched.scheme!r} patch: {', '.join(missing)}")
        with torch.no_grad():
            for key, tensor in found.items():
                wanted[key].copy_(tensor)
    taken = (stock - set(model.state_dict())) | set(wanted)
    info = {**info, "missing_keys": {k for k in info["missing_keys"] if k not in taken},
            "unexpected_keys": {k for k in info["unexpected_keys"] if renamed(k) not in wanted}}
    compat.log_load_report(model, str(path), info, f"keys of its {patched.scheme!r} patch left out")
    return info
