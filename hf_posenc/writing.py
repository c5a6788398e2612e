"""Saving a patched model so that every folder hf-posenc writes loads back as what it is.

transformers saves a patched model under its stock `model_type`, and a plain `from_pretrained`
then silently runs the stock positions under the new weights. So `patch` gives the model its own
`save_pretrained` (`functools.partial(save_pretrained, model)`: plain data, picklable and
deep-copyable), which lets transformers save and then marks the folder (`mark_folder`):

- `modeling_posenc.py` (remote code that loads through hf-posenc) is written next to the weights,
  and `config.auto_map` names it for every Auto class that builds the architecture, so
  `AutoModel*.from_pretrained(folder, trust_remote_code=True)` gives the patched model;
- a config-only patch (RoPE scalings as `rope_parameters` on a model that already rotates: plain
  transformers rebuilds it from the config alone) keeps its `model_type`: plain transformers rebuilds
  exactly that model;
- any other patch gets `model_type` "hf_posenc" (the stock one is kept as `posenc.stock_model_type`)
  and `AutoConfig` in `auto_map`: without `trust_remote_code=True` transformers refuses the folder
  and says to pass it, instead of loading the stock model;
- and its `architectures` name classes only hf-posenc provides (`PosEncLlamaForCausalLM`; the stock
  names are kept as `posenc.architectures`): engines (vLLM, SGLang, TGI) dispatch on `architectures`
  alone and never run remote code, so with the stock name they would serve the stock positions
  under the new weights. An engine without hf-posenc's plug-in (`hf_posenc.serving`) refuses the
  folder by that name.

Reading any of these layouts back (folders written before this one included) is `hf_posenc.loading`'s.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from . import folders
from .errors import PosEncError
from .state import STATE_ATTR

__all__ = ["ARCHITECTURE_PREFIX", "AUTO_CLASSES", "LEGACY_MODEL_TYPE", "MODEL_TYPE", "STOCK_MODEL_TYPE", "LEGACY_REMOTE_CODE", "REMOTE_CLASSES", "REMOTE_CODE", "auto_map", "built_by",
           "mark_folder", "own_architecture", "save_pretrained", "stock_architectures", "stock_model_type"]

MODEL_TYPE = "hf_posenc"
# `architectures` of a folder whose positions its stock class does not compute: the stock name behind it
ARCHITECTURE_PREFIX = "PosEnc"
REMOTE_CODE = "modeling_posenc.py"
REMOTE_CONFIG = "PosEncAutoConfig"
# The remote code as folders written by earlier hf-posenc versions carry it, byte for byte (package data): a
# release must load those too (`hf_posenc.self_check` loads a folder with each). v1: before 2026-11-25, imports
# `from hf_posenc.saving import from_pretrained, load_config` (`hf_posenc.saving` keeps those names).
LEGACY_REMOTE_CODE = ("modeling_posenc_v1.py",)
# Where a folder of a patch that is not config-only keeps its stock model_type. Not `posenc.model_type`: transformers' config reader takes
# a nested dict whose `model_type` is the class's own as the config itself (how it reads composite configs), so
# `LlamaConfig.from_pretrained(folder)` would read the posenc dict and build a default 7B Llama.
STOCK_MODEL_TYPE = "stock_model_type"
LEGACY_MODEL_TYPE = "model_type"  # folders written before STOCK_MODEL_TYPE
# The one Auto-class table, most specific head first: Auto class -> (the class of the remote-code file that
# loads through it -- one each: the file must know which head was asked for --, the pipeline tag of a model
# card that loads the model with it; None: cards do not name it).
AUTO_CLASSES: dict[str, tuple[str, str | None]] = {
    "AutoModelForCausalLM": ("PosEncForCausalLM", "text-generation"),
    "AutoModelForMaskedLM": ("PosEncForMaskedLM", "fill-mask"),
    "AutoModelForSequenceClassification": ("PosEncForSequenceClassification", "text-classification"),
    "AutoModelForTokenClassification": ("PosEncForTokenClassification", "token-classification"),
    "AutoModelForQuestionAnswering": ("PosEncForQuestionAnswering", "question-answering"),
    "AutoModel": ("PosEncModel", "feature-extraction"),
    "AutoModelForSeq2SeqLM": ("PosEncForSeq2SeqLM", None),
    "AutoModelForSpeechSeq2Seq": ("PosEncForSpeechSeq2Seq", None),
}
REMOTE_CLASSES = {auto: remote for auto, (remote, _) in AUTO_CLASSES.items()}
# from_pretrained kwargs that locate files: the config reader consumes them, the weights need them too
HUB_KWARGS = ("cache_dir", "force_download", "proxies", "token", "local_files_only", "revision", "subfolder",
              "gguf_file")
# save_pretrained(push_to_hub=True, ...) kwargs that belong to the upload
PUSH_KWARGS = ("repo_id", "commit_message", "commit_description", "private", "token", "revision", "create_pr", "tags")


def remote_code(name: str = REMOTE_CODE) -> str:
    """The text of the remote-code file written into every patched folder (or of a `LEGACY_REMOTE_CODE` one)."""
    return (resources.files("hf_posenc") / "model_cards" / name).read_text(encoding="utf-8")


def built_by(auto_class: str) -> dict[str, str | tuple[str, ...]]:
    """model_type -> the class name(s) an Auto class builds for it (transformers' own mapping names)."""
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, auto_class)._model_mapping._model_mapping


def auto_map(model_type: str, config_only: bool, old: dict[str, str] | None = None) -> dict[str, str]:
    """`config.auto_map` of a patched folder: every Auto class whose mapping builds `model_type`
    (a head loaded from a checkpoint of another head is what transformers does too), plus
    AutoConfig when the folder has a model_type of its own. Entries of other remote code are kept."""
    stem = Path(REMOTE_CODE).stem
    entries = {k: v for k, v in (old or {}).items() if not v.startswith(f"{stem}.")}
    entries.update({auto: f"{stem}.{cls}" for auto, cls in REMOTE_CLASSES.items() if model_type in built_by(auto)})
    if not config_only:
        entries["AutoConfig"] = f"{stem}.{REMOTE_CONFIG}"
    return dict(sorted(entries.items()))


def stock_model_type(config: dict[str, Any]) -> str | None:
    """The stock model_type of a config.json dict hf-posenc marked as its own (any layout it has written)."""
    posenc = config.get("posenc") or {}
    return posenc.get(STOCK_MODEL_TYPE) or posenc.get(LEGACY_MODEL_TYPE)


def own_architecture(stock: str) -> str:
    """The architecture a folder of a patch that is not config-only names: a class only hf-posenc provides."""
    return f"{ARCHITECTURE_PREFIX}{stock}"


def stock_architectures(config: Any) -> list[str]:
    """The transformers classes a config (a transformers config or a config.json dict) was saved from:
    the stock names behind hf-posenc's own (`posenc.architectures`), else `architectures` as written
    (config-only folders, and folders written before the names existed)."""
    fields = config if isinstance(config, dict) else vars(config)
    return list((fields.get("posenc") or {}).get("architectures") or fields.get("architectures") or [])


def _write_text(path: Path, text: str) -> None:
    """Replace a file atomically, through a new inode (never through a hard link to another folder's file)."""
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def mark_folder(folder: str | os.PathLike, config_only: bool) -> None:
    """Make a saved patched folder load back as what it is (see the module docstring); idempotent,
    and a folder without `config.posenc` is left alone."""
    folder = Path(folder)
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    posenc = config.get("posenc")
    if not posenc:
        return
    model_type = stock_model_type(config) if config.get("model_type") == MODEL_TYPE else config["model_type"]
    # transformers writes the class it saved; a copied marked config.json already has hf-posenc's names
    stock = [name.removeprefix(ARCHITECTURE_PREFIX) for name in config.get("architectures") or []]
    posenc.pop(LEGACY_MODEL_TYPE, None)
    if config_only:
        config["model_type"] = model_type
        posenc.pop(STOCK_MODEL_TYPE, None)
        posenc.pop("architectures", None)
    else:
        config["model_type"], posenc[STOCK_MODEL_TYPE] = MODEL_TYPE, model_type
        if stock:
            posenc["architectures"] = stock
    if stock:
        config["architectures"] = stock if config_only else [own_architecture(name) for name in stock]
    config["auto_map"] = auto_map(model_type, config_only, config.get("auto_map"))
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
        mark_folder(save_directory, config_only=getattr(model, STATE_ATTR).config_only)
        if not folders.is_marked(save_directory):  # a command's own marker (patch, train) says more
            folders.mark(save_directory, "save_pretrained", [model.config.name_or_path])
    if push:
        model.push_to_hub(hub.pop("repo_id", Path(save_directory).name), **hub)

