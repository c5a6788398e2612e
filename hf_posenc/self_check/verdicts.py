"""Self-check verdicts kept on disk, so a machine pays for each check once and not in every new process.

A verdict holds for one (transformers, torch, hf-posenc, model class, scheme). hf-posenc's own version is its
release number plus a digest of its source files: an edited checkout is a new version. An entry that does not read
back as a report of exactly that key (cut short, edited, another key's) is ignored and checked again, never trusted.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from ..paths import cache_root
from ..version import __version__

FORMAT = 1
SUBDIR = "self_check"


@functools.cache
def source_digest() -> str:
    """sha256 of every .py file of the installed hf_posenc, by path: what the checks ran."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def key(model_class: type, scheme: str) -> dict[str, str]:
    versions = {name: metadata.version(name) for name in ("transformers", "torch")}
    return {**versions, "hf_posenc": f"{__version__}+{source_digest()}",
            "model_class": f"{model_class.__module__}.{model_class.__qualname__}", "scheme": scheme}


def directory() -> Path:
    return cache_root() / SUBDIR


def path_for(entry_key: dict[str, str]) -> Path:
    name = hashlib.sha256(json.dumps(entry_key, sort_keys=True).encode()).hexdigest()[:32]
    return directory() / f"{name}.json"


def load(entry_key: dict[str, str], build: Callable[[dict[str, Any]], Any]) -> Any | None:
    """The report kept for `entry_key` (rebuilt by `build(fields)`), or None if there is none or it is damaged."""
    try:
        stored = json.loads(path_for(entry_key).read_text(encoding="utf-8"))
        if stored.get("format") != FORMAT or stored.get("key") != entry_key:
            return None
        return build(stored["report"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def store(entry_key: dict[str, str], report: Any) -> None:
    """Write `report` for `entry_key` whole or not at all (a temporary file renamed); a cache that cannot be
    written is no reason to fail a patch."""
    path = path_for(entry_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as out:
            json.dump({"format": FORMAT, "key": entry_key, "report": dataclasses.asdict(report)}, out, indent=1)
        os.replace(out.name, path)
    except OSError:
        pass
