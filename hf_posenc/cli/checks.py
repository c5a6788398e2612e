"""Checks the subcommands run in `check(args)`, before any model loads: without torch, flag domains, the model a
name points at (its folder, config.json and weights files, read as bytes and JSON), options against the facts
config.json states, Hub repo ids; then `check_model_takes`, the last, through transformers (the model's config, its
model on the meta device, no weights). Each failure is a `PosEncError` naming the flag or file and what is allowed
(exit 2)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import PosEncError, Unsupported
from ..models import HUB_WAIT_S, NAMED_MODELS, recorded_config, source, unanswered_hub

# config.json's name for the number of layers, by family (GPT-2 and BLOOM say n_layer, T5 num_layers)
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# config.json's names of the facts option domains name (hf_posenc.domains.FACTS), by family
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")
HEADS_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
# What a config.json that names no head_dim and no rotating fraction gets from its transformers config class, by
# model_type: (head_dim, None for hidden_size // heads; partial_rotary_factor). The types where the hidden size is
# also the width positions are added at (no separate embedding size). Other types are checked when patching only;
# tests/test_fast_refusals.py checks each row against the installed transformers.
CONFIG_DEFAULTS: dict[str, tuple[int | None, float]] = {
    **dict.fromkeys(("gpt2", "opt", "bert", "roberta", "bloom", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe",
                     "qwen3_moe", "phi3", "smollm3", "starcoder2", "olmo2"), (None, 1.0)),
    "gpt_neox": (None, 0.25), "stablelm": (None, 0.25), "phi": (None, 0.5),
    "qwen3": (128, 1.0), "gemma": (256, 1.0), "gemma2": (256, 1.0), "gemma3_text": (256, 1.0),
}


def at_least(args: argparse.Namespace, **minimums: int) -> None:
    """Each named integer flag (the argparse dest), when given, is at least its minimum."""
    for dest, low in minimums.items():
        value = getattr(args, dest)
        if value is not None and value < low:
            raise PosEncError(f"--{dest.replace('_', '-')} must be an integer >= {low}, got {value}")


def repo_id(value: str | None, flag: str) -> None:
    """A Hub repo id (`owner/name` or `name`), by huggingface_hub's own rule, before any request."""
    if value is None:
        return
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError as err:
        reason = str(err).splitlines()[0]
        raise PosEncError(f"{flag} {value!r} is not a Hub repo id ('owner/name': letters, digits, '-', '_', '.'; "
                          f"{reason})") from None


def read_json(path: Path, what: str) -> Any:
    """A JSON file, or one line naming the file and where it stops being JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise PosEncError(f"{path}: {what} is not a text file") from None
    except json.JSONDecodeError as err:
        raise PosEncError(f"{path}: {what} is not valid JSON (line {err.lineno}, column {err.colno}: "
                          f"{err.msg})") from None


def check_weights(file: Path) -> None:
    """A safetensors file is whole: its header reads and the file is as long as the header says.
    Format: 8-byte little-endian header length, the JSON header, then the tensors' bytes."""
    size = file.stat().st_size
    with file.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little") if size >= 8 else -1
        try:
            header = json.loads(handle.read(length)) if 0 <= length <= size - 8 else None
        except ValueError:
            header = None
    ends = [entry["data_offsets"][1] for key, entry in (header or {}).items()
            if key != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2]
    needed = 8 + length + max(ends, default=0)
    if header is None or needed > size:
        raise PosEncError(f"{file}: cannot read the weights ({size} bytes, "
                          f"{'no readable header' if header is None else f'the header promises {needed}'}): the file "
                          "is damaged or incomplete; save or download the model again")


def saved_patch(config_path: Path, config: dict[str, Any]) -> None:
    """A folder's `config.posenc`, when present, is a patch this hf-posenc reads (so the load cannot fail on it)."""
    from ..writing import MODEL_TYPE

    posenc = config.get("posenc")
    if posenc is None:
        if config.get("model_type") == MODEL_TYPE:
            raise PosEncError(f"{config_path}: model_type is {MODEL_TYPE!r} but posenc is missing or null: the "
                              "folder is damaged; save the patched model again with model.save_pretrained")
        return
    if not isinstance(posenc, dict) or not isinstance(posenc.get("scheme"), str) \
            or not isinstance(posenc.get("options", {}), dict):
        raise PosEncError(f"{config_path}: posenc must be a mapping with a scheme name and options (a mapping), got "
                          f"{json.dumps(posenc)}; save the patched model again with model.save_pretrained")
    from ..config import PosEncConfig  # the option checks of the scheme itself

    try:
        PosEncConfig.from_dict(posenc)
    except PosEncError as err:
        raise PosEncError(f"{config_path}: posenc: {err}") from None


def model_folder(name: str, flag: str) -> Path | None:
    """What `name` points at exists and is whole: a package model, a Hub id (None: read at load), or a
    folder with a readable config.json and complete *.safetensors files. Returns the local folder."""
    try:
        return _model_folder(name)
    except PosEncError as err:
        raise PosEncError(f"{flag}: {err}") from None


def _model_folder(name: str) -> Path | None:
    path, kwargs = source(name)
    folder = Path(path)
    if not folder.is_dir():
        hub_reachable(name)
        return None
    if "gguf_file" in kwargs:
        return folder
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise PosEncError(f"{name}: the folder has no config.json; give a folder written by "
                          "model.save_pretrained (or hf-posenc patch / train), a Hub id or a package model name")
    config = read_json(config_path, "the model config")
    if not isinstance(config, dict) or "model_type" not in config:
        raise PosEncError(f"{config_path}: a model config is a JSON mapping with a model_type; save the model "
                          "again with model.save_pretrained")
    saved_patch(config_path, config)
    for file in sorted(folder.glob("*.safetensors")):
        check_weights(file)
    return folder


def hub_reachable(repo: str) -> None:
    """A Hub id that is not in the local cache needs the Hub: refused at once when HF_HUB_OFFLINE is set, or
    when the Hub does not answer within HUB_WAIT_S, instead of after half a minute of the Hub client's retries."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    if (Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model") / "snapshots").is_dir():
        return
    names = f"a model folder or one of {', '.join(NAMED_MODELS)}"
    if constants.HF_HUB_OFFLINE:
        raise PosEncError(f"{repo!r} is not a local folder, and as a Hub id it is not in the local cache while "
                          f"HF_HUB_OFFLINE is set; give {names}, or unset HF_HUB_OFFLINE to download it")
    host = unanswered_hub()
    if host is not None:
        raise PosEncError(f"{repo!r} is not a local folder, and the Hub ({host}) did not answer within "
                          f"{HUB_WAIT_S} s to fetch it as a Hub id; give {names}, or check the network")


def config_dict(name: str) -> dict[str, Any] | None:
    """A model's config as JSON, torch-free: a folder's config.json or a packaged model's recorded one
    (None for a Hub id, or a folder with none)."""
    path, _ = source(name)
    if name in NAMED_MODELS:
        return recorded_config(name, path)
    config_path = Path(path) / "config.json"
    return read_json(config_path, "the model config") if config_path.is_file() else None


def config_facts(config: Any) -> dict[str, Any]:
    """The model facts option domains name (`hf_posenc.domains.FACTS`), from a config.json dict without torch, as
    `ModelFacts.named()` gives them when patching; {} where not sure (a type not in CONFIG_DEFAULTS, an
    encoder-decoder, an already patched folder): those are checked when patching."""
    if not isinstance(config, dict) or config.get("model_type") not in CONFIG_DEFAULTS or "posenc" in config \
            or config.get("is_encoder_decoder"):
        return {}
    head_dim, partial = CONFIG_DEFAULTS[config["model_type"]]
    width = next((config[key] for key in WIDTH_KEYS if isinstance(config.get(key), int)), None)
    heads = next((config[key] for key in HEADS_KEYS if isinstance(config.get(key), int)), None)
    if isinstance(config.get("head_dim"), int):
        head_dim = config["head_dim"]
    elif head_dim is None and width and heads:
        head_dim = width // heads
    rope = next((config[key] for key in ("rope_parameters", "rope_scaling") if isinstance(config.get(key), dict)), {})
    stated = [config.get("partial_rotary_factor"), rope.get("partial_rotary_factor"), config.get("rotary_pct")]
    partial = next((value for value in stated if isinstance(value, (int, float))), partial)
    return {"hidden_size": width, "num_heads": heads, "head_dim": head_dim, "partial": float(partial)}


def options_fit(name: str, patch: Any) -> None:
    """A patch's options against the bounds that name a model fact (concat's d_pos under the hidden size,
    LongRoPE's lists one entry per rotated pair), from the config as JSON: the same check and message as when
    patching (`hf_posenc.plan.resolve_options`), before transformers imports."""
    try:
        config = config_dict(name) if patch is not None else None
    except PosEncError:
        return  # an unreadable config.json: `model_folder` says so, naming the flag
    if not (facts := config_facts(config)):
        return
    from ..config import options_class
    from ..domains import check_facts

    try:
        check_facts(options_class(patch.scheme), patch.options, facts)
    except PosEncError as err:
        raise PosEncError(f"{name!r} ({config['model_type']}): scheme {patch.scheme!r}: {err}") from None


def layers_fit(name: str, layers: list[int], flag: str) -> None:
    """--layers against the depth in the model's config, read as JSON before transformers imports (seconds
    on a busy machine) and before any weights file is opened; the full check of which layers attend follows."""
    config = config_dict(name)
    if not isinstance(config, dict) or config.get("is_encoder_decoder"):
        return  # two stacks: the patch plan decides
    depth = next((config[key] for key in DEPTH_KEYS if isinstance(config.get(key), int)), None)
    if depth is None or not (bad := sorted(i for i in layers if not 0 <= i < depth)):
        return
    model_type = (config.get("posenc") or {}).get("model_type") or config.get("model_type")
    raise PosEncError(f"{flag}: {name!r}: layers {bad} are not attention layers of this {model_type!r} model: it "
                      f"has {depth} layers, 0-{depth - 1}")


def check_model_takes(model: str, scheme: Any) -> None:
    """The model exists and takes `scheme` (a name or a PosEncConfig) with its options resolved against the
    model's facts (`hf_posenc.patching.validate`: e.g. concat's d_pos below the hidden size): read from its
    config alone, the model built on the meta device, no weights."""
    from ..progress import importing

    with importing("checking the model's config (importing torch and transformers first)"):
        from ..loading import load_config
        from ..patching import validate

    config = load_config(model)
    try:
        if scheme is not None:
            validate(config, scheme)
    except Unsupported as err:
        raise PosEncError(f"{model!r} ({config.model_type}) cannot take scheme {err.scheme!r}; "
                          f"it takes: {', '.join(err.supported)} ({err.reason})") from err
    except PosEncError as err:
        raise PosEncError(f"{model!r} ({config.model_type}): {err}") from err