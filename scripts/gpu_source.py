"""The digest of the sources hf-posenc's wheel is built from, in the kit's manifest (scripts/gpu_kit.py) and checked
by scripts/gpu-check against the checkout it runs in: a kit built before the code changed would run the old code.
Standard library only (gpu-check imports it before anything is installed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

BUILT_FROM = ("pyproject.toml", "hf_posenc")  # what decides the wheel's code and metadata (README.md: text only)


def digest(repo: Path) -> str:
    """sha256 over the relative path and bytes of every file of BUILT_FROM (caches left out)."""
    files = []
    for name in BUILT_FROM:
        path = repo / name
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for path in files:
        if "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        h.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
