"""The one way to get a model and its tokenizer from a name, a folder or a Hub id.

Used by every command and by the remote-code file of published repos, so a model loads the same
everywhere: names of package-shipped models (`smollm2`, `minilm`, see `hf_posenc.models`) resolve
to their folders; GGUF files are unpacked into plain dense weights, so the model saves like any
other; every checkpoint goes through `hf_posenc.from_pretrained`, which re-applies a saved patch
(plain `from_pretrained` silently drops it); the model class follows the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from . import compat
from .errors import PosEncError
from .models import NAMED_MODELS, source as _source
from .patching import patch
from .saving import from_pretrained, has_own_model_type, load_config as read_config, stock_architectures

__all__ = ["TASKS", "inference_device_map", "load", "load_config", "load_model", "load_tokenizer", "model_class"]

# task -> Auto class; "saved" is the class the checkpoint was saved as (its stock `architectures`).
TASKS: dict[str, Any] = {
    "causal_lm": transformers.AutoModelForCausalLM,
    "classification": transformers.AutoModelForSequenceClassification,
    "masked_lm": transformers.AutoModelForMaskedLM,
    "seq2seq": transformers.AutoModelForSeq2SeqLM,
    "base": transformers.AutoModel,
    "saved": None,
}
def _failed(name_or_path: str, what: str, err: Exception) -> PosEncError:
    return PosEncError(f"cannot load the {what} of {name_or_path!r} ({type(err).__name__}: {err}); give a saved "
                       f"model folder, a reachable Hub id or one of {', '.join(NAMED_MODELS)}")


def load_config(name_or_path: str) -> PretrainedConfig:
    """The config alone (cheap): enough to check what a model supports before its weights load."""
    path, kwargs = _source(name_or_path)
    try:
        return read_config(path, **kwargs)
    except (OSError, ValueError) as err:
        raise _failed(name_or_path, "config", err) from None


def model_class(name_or_path: str, task: str, config: PretrainedConfig | None = None) -> Any:
    """The transformers class for a task; "saved" reads it from the config (GGUF files, which name
    none, hold causal LMs)."""
    if task not in TASKS:
        raise PosEncError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if TASKS[task] is not None:
        return TASKS[task]
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
        task: a key of `TASKS`: the head to load ("saved": the class the checkpoint names).
        dtype: parameter dtype (GGUF weights are unpacked to it); None leaves transformers' default.
        scheme, options: apply `hf_posenc.patch(model, scheme, **options)` after loading.
        config: an already loaded config (the remote-code entry point gets one from transformers).
        **kwargs: passed to `from_pretrained` (attn_implementation, num_labels, revision,
            device_map (see `inference_device_map`), ...).
    """
    path, source_kwargs = _source(name_or_path)
    if "gguf_file" in source_kwargs:
        source_kwargs.update(compat.dense_gguf_kwargs(source_kwargs["gguf_file"]))
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
        raise _failed(name_or_path, "weights", err) from None
    except SafetensorError as err:
        raise PosEncError(f"{_damaged(path) or path}: cannot read the weights ({err}): the file is damaged or "
                          "incomplete; save or download the model again") from None
    if scheme is not None:
        patch(model, scheme, **(options or {}))
    return model.eval()


def _damaged(folder: str) -> str | None:
    """The first weights file of a local folder whose safetensors header does not read."""
    for file in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(file, framework="pt"):
                pass
        except SafetensorError:
            return str(file)
    return None


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    path, kwargs = _source(name_or_path)
    extra = {k: v for k, v in kwargs.items() if k == "gguf_file"}
    if has_own_model_type(path):  # AutoTokenizer reads the model config first: give it the stock one
        extra["config"] = read_config(path)
    try:
        return transformers.AutoTokenizer.from_pretrained(path, **extra)
    except (OSError, ValueError) as err:
        raise _failed(name_or_path, "tokenizer", err) from None


def load(name_or_path: str, *, tokenizer: str | None = None, **kwargs: Any
         ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer): `load_model(name_or_path, **kwargs)` and the tokenizer saved with it (or `tokenizer`)."""
    return load_model(name_or_path, **kwargs), load_tokenizer(tokenizer or name_or_path)
