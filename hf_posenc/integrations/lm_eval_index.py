"""Which lm-eval tasks exist, what data each reads, and which of them can run here: the checks `hf-posenc eval
--suite lm_eval:<task>` makes before any model loads.

lm-eval learns its tasks by parsing its ~14,000 YAML files each time a `TaskManager` is built (15 to 20 s on a
2-core machine). The checks need only each name's kind, file, tags, group members and dataset fields, so that much
of lm-eval's index is kept in hf-posenc's cache (`$HF_POSENC_CACHE/lm_eval/`), keyed by lm-eval's version and the
task files' sizes and times: the first check builds it, later ones read it in a fraction of a second, without
importing lm-eval.

A task whose data is a Hub dataset in no local cache, while the Hub cannot be reached (HF_HUB_OFFLINE or
HF_DATASETS_OFFLINE set, or no answer within a second), is refused by name, naming the tasks whose data is here:
the package's own, and any whose Hub dataset is cached.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PosEncError
from ..models import HUB_WAIT_S, unanswered_hub
from ..paths import cache_root

__all__ = ["LM_EVAL_TASK_DIR", "check_data_here", "hub_dataset", "leaf_configs", "named", "task_index",
           "tasks_here"]

LM_EVAL_TASK_DIR = Path(__file__).with_name("lm_eval_tasks")  # the package's offline tasks (posenc_*)
INDEX_FORMAT = 1  # bumped when what is kept of an entry changes
# `datasets`' packaged builders: a task naming one as its dataset_path reads the files of its data_files
BUILDERS = frozenset({"json", "csv", "text", "parquet", "arrow", "pandas"})
HUB_FILE = re.compile(r"hf://datasets/([^/@]+/[^/@]+)")
SHOWN = 12  # names a refusal lists before "and N more"


def _task_roots() -> list[Path]:
    """lm-eval's task folder (found without importing lm-eval, which imports torch), then the package's."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PosEncError("lm-eval is not installed: pip install 'hf-posenc[lm-eval]'")
    return [Path(next(iter(spec.submodule_search_locations))) / "tasks", LM_EVAL_TASK_DIR]


def _fingerprint(roots: Sequence[Path]) -> str:
    """lm-eval's version and every task file's path, size and time: a changed file gives another index."""
    listed = []
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]  # written by imports, not task files
            for name in files:
                stat = os.stat(os.path.join(folder, name))
                listed.append(f"{folder}/{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n")
    digest = hashlib.sha256(f"{INDEX_FORMAT} {importlib.metadata.version('lm_eval')}\n".encode())
    digest.update("".join(sorted(listed)).encode())
    return digest.hexdigest()[:16]


def _kept(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """What the checks read of an entry's config: a group's members, a task's name and dataset fields."""
    if kind == "GROUP":
        return {"task": config.get("task") or []}
    kept = {key: config[key] for key in ("task", "dataset_path") if key in config}
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    return kept | ({"dataset_kwargs": {"data_files": files}} if files else {})


def _build(roots: Sequence[Path]) -> dict[str, dict[str, Any]]:
    from lm_eval.tasks._index import TaskIndex

    return {name: {"kind": entry.kind.name, "path": str(entry.yaml_path) if entry.yaml_path else None,
                   "tags": sorted(entry.tags), "config": _kept(entry.kind.name, entry.cfg or {})}
            for name, entry in TaskIndex.build(roots).items()}


@functools.cache
def task_index() -> dict[str, dict[str, Any]]:
    """lm-eval's tasks, groups and tags with the package's (name -> kind, path, tags, config), as lm-eval's
    `TaskManager(include_path=LM_EVAL_TASK_DIR)` indexes them; read from hf-posenc's cache, built there on a miss."""
    roots = _task_roots()
    folder = cache_root() / "lm_eval"
    path = folder / f"task-index-{_fingerprint(roots)}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    index = _build(roots)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("task-index-*.json"):  # another lm-eval, or changed task files
            stale.unlink(missing_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")  # concurrent checks each write whole, then rename
        partial.write_text(json.dumps(index, default=str), encoding="utf-8")
        os.replace(partial, path)
    except OSError:  # a read-only cache: this process has the index, the next one builds it again
        pass
    return index


def leaf_configs(names: Iterable[str | Mapping[str, Any]], index: Mapping[str, Mapping[str, Any]]
                 ) -> Iterator[Mapping[str, Any]]:
    """The configs of the tasks that lm-eval names (or a group's inline entries) run: a task's own, each task of a
    tag or a group."""
    for name in names:
        if isinstance(name, Mapping):  # an inline entry of a group: a group, or a task with overrides
            own = index.get(name["task"]) if isinstance(name.get("task"), str) else None
            yield from (leaf_configs(name.get("task") or [], index) if "group" in name
                        else [{**(own["config"] if own else {}), **name}])
            continue
        entry = index.get(name)
        kind = entry["kind"] if entry is not None else None
        if kind == "TAG":
            yield from leaf_configs(entry["tags"], index)
        elif kind == "GROUP":
            yield from leaf_configs(entry["config"]["task"], index)
        elif kind is not None:
            yield entry["config"]


def hub_dataset(config: Mapping[str, Any]) -> str | None:
    """The Hub dataset a task config reads (its dataset_path, or the repo of `hf://datasets/...` data files); None
    where it names none: local files, or data the task's own code makes (the package's tasks)."""
    files = (config.get("dataset_kwargs") or {}).get("data_files") or []
    for value in files.values() if isinstance(files, Mapping) else [files]:
        for file in [value] if isinstance(value, str) else value:
            if found := HUB_FILE.match(str(file)):
                return found.group(1)
    path = config.get("dataset_path")
    return None if not path or path in BUILDERS or Path(path).expanduser().exists() else path


@functools.cache
def cached(repo: str) -> bool:
    """A Hub dataset `datasets` loads without the Hub: in the Hub's file cache, or in its own Arrow cache."""
    import datasets.config
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return ((Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="dataset") / "snapshots").is_dir()
            or (Path(datasets.config.HF_DATASETS_CACHE) / repo.replace("/", "___")).is_dir())


def tasks_here() -> list[str]:
    """The tasks whose data is here: the package's own (they make it from its offline text), and lm-eval's whose Hub
    dataset is in a local cache."""
    here = []
    for name, entry in task_index().items():
        if entry["kind"] in ("TASK", "PY_TASK") and entry["path"] is not None:
            repo = hub_dataset(entry["config"])
            if Path(entry["path"]).is_relative_to(LM_EVAL_TASK_DIR) or (repo is not None and cached(repo)):
                here.append(name)
    return sorted(here)


def named(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def hub_unreachable() -> tuple[str, str] | None:
    """(why the Hub cannot be reached, what to do about it), or None when it answers."""
    import datasets.config
    from huggingface_hub import constants

    if datasets.config.HF_HUB_OFFLINE:
        flag = "HF_HUB_OFFLINE" if constants.HF_HUB_OFFLINE else "HF_DATASETS_OFFLINE"
        return f"{flag} is set", f"unset {flag} to download it"
    host = unanswered_hub()
    return None if host is None else (f"the Hub ({host}) did not answer within {HUB_WAIT_S} s", "check the network")


def check_data_here(tasks: Sequence[str], also_here: str = "") -> None:
    """Each task's Hub datasets are in a local cache, or the Hub answers: else a PosEncError naming the task, its
    dataset and the tasks whose data is here (`also_here` adds a note on others that run offline)."""
    index = task_index()
    for task in tasks:
        missing = sorted({repo for config in leaf_configs([task], index)
                          if (repo := hub_dataset(config)) is not None and not cached(repo)})
        if missing and (unreachable := hub_unreachable()) is not None:
            why, remedy = unreachable
            read = f"dataset {missing[0]!r}, which is" if len(missing) == 1 else f"datasets {named(missing)}, which are"
            raise PosEncError(f"lm-eval task {task!r} reads the Hub {read} not in the local cache, and {why}; "
                              f"tasks whose data is here: {named(tasks_here())}{also_here}; or {remedy}")
