"""Saving a patched model so that every folder hf-posenc writes loads back as what it is.

transformers saves a patched model under its stock `model_type`, and a plain `from_pretrained`
then silently runs the stock positions under the new weights. So `patch` gives the model its own
`save_pretrained` (`functools.partial(save_pretrained, model)`: plain data, picklable and
deep-copyable), which lets transformers save and then marks the folder (`mark_folder`):

- `modeling_posenc.py` (remote code that loads through hf-posenc) is written next to the weights,
  and `config.auto_map` names it for every Auto class that builds the architecture, so
  `AutoModel*.from_pretrained(folder, trust_remote_code=True)` gives the patched model;
- a patch that is native to transformers (RoPE scalings as `rope_parameters` on a model that
  already rotates) keeps its `model_type`: plain transformers rebuilds exactly that model;
- any other patch gets `model_type` "hf_posenc" (the stock one is kept as `posenc.model_type`)
  and `AutoConfig` in `auto_map`: without `trust_remote_code=True` transformers refuses the folder
  and says to pass it, instead of loading the stock model;
- and its `architectures` name classes only hf-posenc provides (`PosEncLlamaForCausalLM`; the stock
  names are kept as `posenc.architectures`): engines (vLLM, SGLang, TGI) dispatch on `architectures`
  alone and never run remote code, so with the stock name they would serve the stock positions
  under the new weights. An engine without hf-posenc's plug-in (`hf_posenc.serving`) refuses the
  folder by that name.

`load_config` and `from_pretrained` (= `hf_posenc.from_pretrained`) read every layout, folders
written before this one included.
"""

from __future__ import annotations

import copy
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from . import folders
from .errors import PosEncError
from .state import STATE_ATTR

__all__ = ["ARCHITECTURE_PREFIX", "MODEL_TYPE", "REMOTE_CLASSES", "REMOTE_CODE", "auto_map", "from_pretrained",
           "load_config", "mark_folder", "native_config", "own_architecture", "save_pretrained",
           "stock_architectures"]

MODEL_TYPE = "hf_posenc"
# `architectures` of a folder whose positions its stock class does not compute: the stock name behind it
ARCHITECTURE_PREFIX = "PosEnc"
REMOTE_CODE = "modeling_posenc.py"
REMOTE_CONFIG = "PosEncAutoConfig"
# Auto class -> the class of the remote-code file that loads through it (one each: the file must
# know which head was asked for).
REMOTE_CLASSES = {
    "AutoModel": "PosEncModel",
    "AutoModelForCausalLM": "PosEncForCausalLM",
    "AutoModelForMaskedLM": "PosEncForMaskedLM",
    "AutoModelForSequenceClassification": "PosEncForSequenceClassification",
    "AutoModelForTokenClassification": "PosEncForTokenClassification",
    "AutoModelForQuestionAnswering": "PosEncForQuestionAnswering",
    "AutoModelForSeq2SeqLM": "PosEncForSeq2SeqLM",
    "AutoModelForSpeechSeq2Seq": "PosEncForSpeechSeq2Seq",
}
# from_pretrained kwargs that locate files: the config reader consumes them, the weights need them too
HUB_KWARGS = ("cache_dir", "force_download", "proxies", "token", "local_files_only", "revision", "subfolder",
              "gguf_file")
# save_pretrained(push_to_hub=True, ...) kwargs that belong to the upload
PUSH_KWARGS = ("repo_id", "commit_message", "commit_description", "private", "token", "revision", "create_pr", "tags")


def remote_code() -> str:
    """The text of the remote-code file written into every patched folder."""
    return (resources.files("hf_posenc") / "model_cards" / REMOTE_CODE).read_text(encoding="utf-8")


def auto_map(model_type: str, native: bool, old: dict[str, str] | None = None) -> dict[str, str]:
    """`config.auto_map` of a patched folder: every Auto class whose mapping builds `model_type`
    (a head loaded from a checkpoint of another head is what transformers does too), plus
    AutoConfig when the folder has a model_type of its own. Entries of other remote code are kept."""
    from transformers.models.auto import modeling_auto

    stem = Path(REMOTE_CODE).stem
    mappings = {name: getattr(modeling_auto, name)._model_mapping._model_mapping for name in REMOTE_CLASSES}
    entries = {k: v for k, v in (old or {}).items() if not v.startswith(f"{stem}.")}
    entries.update({auto: f"{stem}.{cls}" for auto, cls in REMOTE_CLASSES.items() if model_type in mappings[auto]})
    if not native:
        entries["AutoConfig"] = f"{stem}.{REMOTE_CONFIG}"
    return dict(sorted(entries.items()))


def native_config(config: dict[str, Any]) -> bool:
    """Whether plain transformers rebuilds a saved config.json's patched model from the config alone (folders
    written before the marks existed): the model is patched on the meta device, so nothing is allocated."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .config import PosEncConfig
    from .patching import patch
    from .catalog import get_scheme

    posenc = config.get("posenc")
    if not posenc or config.get("model_type") == MODEL_TYPE:
        return False
    spec = get_scheme(posenc["scheme"])
    if spec.site != "qk":  # every q/k scheme is a RoPE variant transformers can express
        return False
    stock = CONFIG_MAPPING[config["model_type"]].from_dict({k: v for k, v in config.items() if k != "auto_map"})
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(stock)
    patch(model, PosEncConfig.from_dict(posenc))
    return getattr(model, STATE_ATTR).native


def own_architecture(stock: str) -> str:
    """The architecture a non-native patched folder names: a class only hf-posenc provides."""
    return f"{ARCHITECTURE_PREFIX}{stock}"


def stock_architectures(config: Any) -> list[str]:
    """The transformers classes a config (a transformers config or a config.json dict) was saved from:
    the stock names behind hf-posenc's own (`posenc.architectures`), else `architectures` as written
    (native folders, and folders written before the names existed)."""
    fields = config if isinstance(config, dict) else vars(config)
    return list((fields.get("posenc") or {}).get("architectures") or fields.get("architectures") or [])


def _write_text(path: Path, text: str) -> None:
    """Replace a file atomically, through a new inode (never through a hard link to another folder's file)."""
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def mark_folder(folder: str | os.PathLike, native: bool) -> None:
    """Make a saved patched folder load back as what it is (see the module docstring); idempotent,
    and a folder without `config.posenc` is left alone."""
    folder = Path(folder)
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    posenc = config.get("posenc")
    if not posenc:
        return
    model_type = posenc.get("model_type") if config.get("model_type") == MODEL_TYPE else config["model_type"]
    # transformers writes the class it saved; a copied marked config.json already has hf-posenc's names
    stock = [name.removeprefix(ARCHITECTURE_PREFIX) for name in config.get("architectures") or []]
    if native:
        config["model_type"] = model_type
        posenc.pop("model_type", None)
        posenc.pop("architectures", None)
    else:
        config["model_type"], posenc["model_type"] = MODEL_TYPE, model_type
        if stock:
            posenc["architectures"] = stock
    if stock:
        config["architectures"] = stock if native else [own_architecture(name) for name in stock]
    config["auto_map"] = auto_map(model_type, native, config.get("auto_map"))
    _write_text(folder / REMOTE_CODE, remote_code())
    _write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_pretrained(model: Any, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
    """`model.save_pretrained` of a patched model: transformers' own save, then `mark_folder`.
    `push_to_hub=True` uploads the marked folder through `model.push_to_hub`."""
    if os.path.isfile(save_directory):
        raise PosEncError(f"{save_directory} is a file; save_pretrained takes a folder")
    push = kwargs.pop("push_to_hub", False)
    hub = {key: kwargs.pop(key) for key in PUSH_KWARGS if key in kwargs}
    type(model).save_pretrained(model, save_directory, *args, **kwargs)
    if kwargs.get("is_main_process", True) and getattr(model.config, "posenc", None):
        mark_folder(save_directory, native=getattr(model, STATE_ATTR).native)
        if not folders.is_marked(save_directory):  # a command's own marker (patch, train) says more
            folders.mark(save_directory, "save_pretrained", [model.config.name_or_path])
    if push:
        model.push_to_hub(hub.pop("repo_id", Path(save_directory).name), **hub)


def has_own_model_type(folder: str | os.PathLike) -> bool:
    """Whether a local folder's config.json has hf-posenc's model_type (transformers' Auto classes,
    AutoTokenizer included, then need `trust_remote_code=True` or a config passed in)."""
    path = Path(folder) / "config.json"
    return path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("model_type") == MODEL_TYPE


def _stock_dict(config: dict[str, Any]) -> dict[str, Any]:
    """A marked config.json as transformers' stock config class reads it."""
    config = copy.deepcopy(config)
    posenc = config.get("posenc") or {}
    if "model_type" not in posenc:
        raise PosEncError(f"config.json has model_type {MODEL_TYPE!r} but no posenc.model_type: it was not "
                          "written by hf-posenc; save the model again with model.save_pretrained")
    config["model_type"] = posenc.pop("model_type")
    return config


def load_config(path: str | os.PathLike, **kwargs: Any) -> Any:
    """The stock transformers config of a saved folder, Hub repo or GGUF file, in any layout,
    with `config.posenc`; behaves as `AutoConfig.from_pretrained(path, **kwargs)` otherwise
    (`return_unused_kwargs=True` returns (config, unused kwargs)). `architectures` stay as written:
    an engine reads this config (AutoConfig with `trust_remote_code=True`) and must see hf-posenc's
    names; `stock_architectures` gives the classes behind them."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kwargs.pop("trust_remote_code", None)  # the stock classes need none
    config, unused = transformers.PretrainedConfig.get_config_dict(path, **kwargs)
    if config.get("model_type") != MODEL_TYPE:
        return transformers.AutoConfig.from_pretrained(path, **kwargs)
    config = _stock_dict(config)
    if config["model_type"] not in CONFIG_MAPPING:
        raise PosEncError(f"{path} holds a {config['model_type']!r} model, which this transformers "
                          f"{transformers.__version__} does not know; upgrade transformers")
    return CONFIG_MAPPING[config["model_type"]].from_dict(config, **unused)


def from_pretrained(path: str | os.PathLike, model_cls: Any = None, **kwargs: Any) -> Any:
    """Load a model saved after `patch`, with its positional scheme and the scheme's weights.

    Plain `from_pretrained` of a patched folder either refuses it (a scheme transformers cannot
    express) or needs `trust_remote_code=True`; this reads every layout hf-posenc has written and
    re-applies `config.posenc` before the patch's weights load.

    Args:
        path: a local folder or Hub repo id.
        model_cls: the transformers Auto class or model class (default `AutoModelForCausalLM`).
        **kwargs: passed to `model_cls.from_pretrained` (dtype, attn_implementation, revision, ...).
    """
    from .patching import from_pretrained as load_patched

    kwargs.pop("trust_remote_code", None)
    config = kwargs.pop("config", None)
    if config is None:
        # as transformers' Auto classes do: the config takes its kwargs, the model the rest and the dtype
        # the dtype stays a loading argument: a config given dtype="auto" would keep the string
        dtypes = {k: kwargs.pop(k) for k in ("dtype", "torch_dtype") if k in kwargs}
        try:
            config, rest = load_config(path, return_unused_kwargs=True, **kwargs)
        except PosEncError:
            raise
        except (OSError, ValueError) as err:  # no config.json, or not one transformers reads
            from .loading import _failed

            raise _failed(str(path), "config", err) from None
        kwargs = {**{k: kwargs[k] for k in HUB_KWARGS if k in kwargs}, **dtypes, **rest}
    else:
        config = copy.deepcopy(config)
    # the model built here is the stock class, patched: its config names that class, as transformers' own would
    stock = stock_architectures(config)
    if stock:
        config.architectures = stock
    if hasattr(config, "auto_map"):
        del config.auto_map  # the model is patched here; remote code would only call back into this function
    return load_patched(path, model_cls, config=config, **kwargs)
