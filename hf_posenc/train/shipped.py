"""The recipes shipped in the package: `hf_posenc/recipes` is the repository's `recipes/` (a link in the source
tree, files in the wheel), so a user who only ran `pip install` can list, copy and run them by name.

A recipe `recipes/<model>/<goal>/config_<variant>.yaml` is named `<model>/<goal>/<variant>`
(`smollm2-135m/alibi/smoke`); `hf-posenc train` and `hf-posenc demo --recipe` take a name or a path.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..errors import PosEncError
from ..folders import writing

SHIPPED = Path(__file__).resolve().parents[1] / "recipes"
PREFIX = "config_"
# a sentence ends at a full stop before a space or the end, but not at the "al." of "et al."
SENTENCE_END = re.compile(r"(?<!\bal)\.(?=\s|$)")


def first_sentence(text: str) -> str:
    """The first sentence of a recipe's opening comment, across its lines: what `hf-posenc recipes` shows, whole."""
    header = " ".join(line.lstrip("# ").strip() for line in itertools.takewhile(lambda l: l.startswith("#"),
                                                                               text.splitlines()))
    end = SENTENCE_END.search(header)
    return header[: end.end()] if end else header


@dataclasses.dataclass(frozen=True)
class ShippedRecipe:
    name: str
    path: Path

    def fields(self) -> dict[str, Any]:
        return yaml.safe_load(self.path.read_text(encoding="utf-8")) or {}

    def summary(self) -> dict[str, Any]:
        """What one line of `hf-posenc recipes` says: model, scheme, what it is for, and its cost in tokens."""
        data = self.fields()
        options = data.get("scheme_options") or {}
        scheme = data.get("scheme") or "its own scheme"
        batch = data.get("global_batch_size") or \
            data.get("per_device_train_batch_size", 8) * data.get("gradient_accumulation_steps", 1)  # on 1 process
        steps = data.get("max_steps") if (data.get("max_steps") or 0) > 0 else None  # -1: it trains by epochs
        tokens = (steps or 0) * batch * (data.get("seq_len") or 0)
        goal = first_sentence(self.path.read_text(encoding="utf-8"))
        return {"name": self.name, "model": data.get("model_name_or_path", ""),
                "scheme": scheme + "".join(f" {k}={v}" for k, v in options.items()),
                "steps": steps, "epochs": data.get("num_train_epochs") if steps is None else None, "tokens": tokens,
                "goal": goal}


def shipped_recipes() -> list[ShippedRecipe]:
    return [ShippedRecipe(_name(path), path) for path in sorted(SHIPPED.glob(f"*/*/{PREFIX}*.yaml"))]


def _name(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.parent.name}/{path.stem.removeprefix(PREFIX)}"


def find(name: str) -> ShippedRecipe:
    """The shipped recipe called `name`, or PosEncError listing the names there are."""
    found = {r.name: r for r in shipped_recipes()}
    if name not in found:
        raise PosEncError(f"no shipped recipe {name!r}; shipped: {', '.join(found)} (`hf-posenc recipes` lists them)")
    return found[name]


def recipe_path(name_or_path: str | Path) -> Path:
    """A recipe file: the path itself if it exists (or is not a recipe name), else the shipped recipe of that name."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yaml", ".yml") or str(name_or_path).count("/") != 2:
        return path
    return find(str(name_or_path)).path


def copy_recipe(name: str, folder: Path) -> Path:
    """An editable copy of a shipped recipe and its model's README in `folder` (new, or empty); returns the YAML."""
    recipe = find(name)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise PosEncError(f"{folder} already exists and is not an empty folder; give a new folder")
    with writing(folder, "recipes copy", [str(recipe.path)]) as staged:
        staged.mkdir()
        shutil.copyfile(recipe.path, staged / recipe.path.name)
        readme = recipe.path.parents[1] / "README.md"
        if readme.is_file():
            shutil.copyfile(readme, staged / "README.md")
    return folder / recipe.path.name
