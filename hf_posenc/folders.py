"""Folders hf-posenc writes, and the one rule for replacing a folder: only what hf-posenc wrote.

Every output folder (patch, train and its checkpoints, eval, inspect, demo, compare, push --dry-run,
`save_pretrained` of a patched model, a recipe copy) gets a small marker file, `.hf-posenc.json`: which
command wrote it, what kind of thing it holds (`KINDS`), when, with which hf-posenc version, from which
sources. `--overwrite` replaces a folder only when the marker is there and says the same command wrote
the same kind: an `eval --overwrite` once replaced a patched model with results.json, because the marker
said only "hf-posenc wrote this". Any other file (a config.json, a results.json) proves nothing: plain
transformers and other tools write those too, so a folder without the marker -- including output of
hf-posenc versions before the marker -- is refused, and the user deletes it or picks a new one. A marker
from before kinds is read by its command, and a folder whose files hold a model (weights, a config.json,
checkpoints) counts as a model whatever its marker says. A command whose run takes long (eval) marks its
folder incomplete until it is done: a run interrupted or failed leaves a folder that was the command's own
and half-written, which a rerun of the same command replaces without --overwrite (and so never answers the
rerun's next mistake with "the folder is not empty").

A folder that is, holds, or lies inside one of the command's sources (the model it reads, the recipe's
data, the results files it compares) is refused whatever the flags: writing there changes the input.

Imports neither torch nor transformers: these checks run before any model loads.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import PosEncError
from .version import __version__

__all__ = ["GGUF_MARK", "KINDS", "MARKER", "check_out", "check_replace", "check_separate", "clear_out", "finished",
           "gguf_mark", "incomplete", "is_marked", "kind_of", "mark", "read_marker", "replaceable", "writing"]

MARKER = ".hf-posenc.json"
GGUF_MARK = "hf_posenc.posenc"  # the key of a GGUF file hf-posenc wrote: what it keeps, as JSON
TOOL = "hf-posenc"
ASK = "delete it yourself if you no longer need it, or choose a new folder"

# the command that writes a folder -> the kind of folder it writes (the marker's "kind")
KINDS: dict[str, str] = {
    "patch": "model", "save_pretrained": "model", "train": "run", "demo": "demo", "eval": "results",
    "eval --compare": "comparison", "inspect": "inspection", "push --dry-run": "staged repo",
    "recipes copy": "recipe copy", "lengthgen study": "study",
}
# each kind, as a refusal names it
KIND_NAMES: dict[str, str] = {
    "model": "a model", "run": "a training run (model and checkpoints)", "demo": "a demo (models and results)",
    "results": "evaluation results", "comparison": "a comparison of results", "inspection": "inspection plots",
    "staged repo": "a staged Hub repo (a model)", "recipe copy": "a recipe copy",
    "study": "a study's results (benchmarks/lengthgen)",
}
# kinds whose folders hold model weights or checkpoints: never replaced by any other kind
HOLDS_MODEL = frozenset({"model", "run", "demo", "staged repo"})
# files that make a folder a model's, whatever its marker says ("checkpoints" is train's folder of them)
MODEL_FILES = ("config.json", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.ckpt", "checkpoints")


def mark(folder: str | os.PathLike, command: str, sources: Iterable[str] = (), complete: bool = True) -> Path:
    """Write the marker into `folder` (which must exist): this folder is hf-posenc output, of `command`'s kind;
    `complete=False` until the command has written all of it (`finished`)."""
    path = Path(folder) / MARKER
    record = {"tool": TOOL, "version": __version__, "command": command, "kind": KINDS[command],
              "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "sources": [str(s) for s in sources], "complete": complete}
    tmp = path.with_name(f".tmp{MARKER}")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_marker(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's marker, or None when it has none (or one that is not hf-posenc's)."""
    path = Path(folder) / MARKER
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("tool") == TOOL else None


def is_marked(folder: str | os.PathLike) -> bool:
    return read_marker(folder) is not None


def finished(folder: str | os.PathLike) -> None:
    """Mark a folder `clear_out(..., until_finished=True)` began as complete: the command wrote all of it."""
    record = read_marker(folder)
    if record is not None:
        mark(folder, record["command"], record.get("sources", ()))


def incomplete(folder: str | os.PathLike, command: str) -> bool:
    """Whether `folder` is this command's own output of a run that was interrupted or failed: the same command
    may take it back (replace it) without --overwrite, as the user's rerun of that run."""
    record = read_marker(folder)
    return record is not None and record.get("complete") is False and replaceable(folder, command)


def holds_model(folder: str | os.PathLike) -> bool:
    """Whether a model's files (weights, a config.json, checkpoints) lie anywhere in `folder`."""
    for _, dirs, files in os.walk(folder):
        if any(fnmatch.fnmatch(name, pattern) for name in (*dirs, *files) for pattern in MODEL_FILES):
            return True
    return False


def kind_of(folder: str | os.PathLike) -> str | None:
    """What a marked folder holds (None: unmarked). A marker from before kinds is read by its command, an
    unknown command as a model; a folder holding a model's files is a model whatever the marker says."""
    record = read_marker(folder)
    if record is None:
        return None
    kind = record.get("kind") or KINDS.get(str(record.get("command")), "model")
    return kind if kind in HOLDS_MODEL or not holds_model(folder) else "model"


def replaceable(folder: str | os.PathLike, command: str) -> bool:
    """Whether `command --overwrite` may replace `folder`: marked, written by the same command, same kind."""
    record = read_marker(folder)
    return record is not None and record.get("command") == command and kind_of(folder) == KINDS[command]


def check_replace(folder: str | os.PathLike, command: str, flag: str = "--out") -> None:
    """Refuse, naming both kinds and a way out, unless `command --overwrite` may replace `folder`."""
    record = read_marker(folder)
    if record is None:
        raise PosEncError(f"{flag} {folder} is not empty and has no {MARKER} marker, so hf-posenc did not write "
                          f"it (or an older version did); --overwrite replaces only marked folders: {ASK}")
    if replaceable(folder, command):
        return
    found, wanted = kind_of(folder) or "model", KINDS[command]
    raise PosEncError(
        f"{flag} {folder} is not empty: it holds {KIND_NAMES.get(found, found)} written by `hf-posenc "
        f"{record.get('command')}`; "
        f"`hf-posenc {command} --overwrite` replaces only {KIND_NAMES[wanted]} written by `hf-posenc {command}`, "
        f"so nothing was changed: choose a new folder (e.g. {Path(folder).name}-{command.split()[0]}), or delete "
        f"{folder} yourself if you no longer need it")


def local_source(name: str | os.PathLike | None) -> Path | None:
    """The file or folder on disk a source names (resolved), or None for a Hub id / package model name."""
    if not name:
        return None
    path = Path(name).expanduser()
    return path.resolve() if path.exists() else None


def check_separate(out: str | os.PathLike, sources: Mapping[str, Any], flag: str = "--out") -> None:
    """`out` is not a source, does not lie inside one, and holds none: writing it never touches an input.

    Args:
        out: the folder to be written.
        sources: what names each input (e.g. {"--model": "./m"}) -> the path or name given.
    """
    target = Path(out).expanduser().resolve()
    for what, name in sources.items():
        source = local_source(name)
        if source is None:
            continue
        if target == source:
            raise PosEncError(f"{flag} {out} is the source ({what} {name}): hf-posenc never writes over its input; "
                              f"choose a new folder")
        if target.is_relative_to(source):
            raise PosEncError(f"{flag} {out} is inside the source ({what} {name}): writing there changes the "
                              f"input; choose a folder outside it")
        if source.is_relative_to(target):
            raise PosEncError(f"{flag} {out} holds the source ({what} {name}): replacing it would delete the "
                              f"input; choose a folder that does not contain it")


def check_out(path: str, overwrite: bool, flag: str = "--out", sources: Mapping[str, Any] | None = None, *,
              command: str) -> Path:
    """An output folder that can be written and holds nothing it would lose: new, empty, or (with
    --overwrite) a folder `command` wrote, of its kind, which `clear_out` replaces when the work starts."""
    out = Path(path)
    check_separate(out, sources or {}, flag)
    if out.is_file():
        raise PosEncError(f"{flag} {path} is a file; give a folder (new or empty)")
    if out.is_dir() and any(out.iterdir()) and not incomplete(out, command):
        if is_marked(out) and not replaceable(out, command):  # another kind: --overwrite would not help
            check_replace(path, command, flag)
        if not overwrite:
            raise PosEncError(f"{flag} {path} is not empty; choose a new folder, or pass --overwrite to replace "
                              f"earlier hf-posenc output")
        check_replace(path, command, flag)
    parent = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PosEncError(f"{flag} {path}: {parent} is not a writable folder; choose another place")
    return out


def clear_out(path: str | os.PathLike, command: str, sources: Iterable[str] = (), until_finished: bool = False
              ) -> Path:
    """Make the (checked) output folder exist, empty but for a new marker: partial output of an
    interrupted run is marked too, so --overwrite can replace it; with `until_finished` it is marked
    incomplete until `finished`, so a rerun of the same command replaces it without --overwrite."""
    out = Path(path)
    if out.is_dir() and any(out.iterdir()):
        if not is_marked(out):  # check_out ran earlier; this guards a folder that changed since
            raise PosEncError(f"{out} has no {MARKER} marker; refusing to replace it: {ASK}")
        check_replace(out, command, "folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    mark(out, command, sources, complete=not until_finished)
    return out


@contextlib.contextmanager
def writing(path: str | os.PathLike, command: str, sources: Iterable[str] = ()) -> Iterator[Path]:
    """Write a (checked) output folder under a temporary name and give it its own name only when the block ends
    without error: the yielded path (not created yet) sits in a hidden staging folder beside `path` and has
    `path`'s name, so what is written there (a model card's title) reads the same. At the end it is marked
    complete and takes `path`'s place, replacing an earlier folder `check_out` allowed; a failure or an
    interrupt removes it, so `path` is as it was: nothing half-written ever carries a complete marker."""
    out = Path(path)
    staging = out.parent / f".hf-posenc-{os.getpid()}-{out.name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging / out.name
        written = staging / out.name
        written.mkdir(exist_ok=True)
        mark(written, command, sources)
        old = staging / ".replaced"
        if out.is_dir() and any(out.iterdir()):
            if not is_marked(out):  # check_out ran earlier; this guards a folder that changed since
                raise PosEncError(f"{out} has no {MARKER} marker; refusing to replace it: {ASK}")
            if not incomplete(out, command):
                check_replace(out, command, "folder")
            os.replace(out, old)
        elif out.is_dir():
            out.rmdir()
        try:
            os.replace(written, out)
        except OSError:
            if old.exists():
                os.replace(old, out)  # the earlier folder goes back where it was
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def gguf_mark(path: str | os.PathLike) -> dict[str, Any] | None:
    """What a GGUF file hf-posenc wrote says of itself (its posenc, llama.cpp architecture, context), or None for
    any other file: a file is replaced or published as hf-posenc's only when it carries the key."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(path).fields.get(GGUF_MARK)
        record = json.loads(field.contents()) if field is not None else None
    except Exception:  # not a GGUF (or gguf missing): not hf-posenc's
        return None
    return record if isinstance(record, dict) else None
