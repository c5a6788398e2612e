"""Reading a recipe: a YAML file and `--section.field value` overrides into a validated `Recipe`.

Each section is parsed by transformers' `HfArgumentParser`, its YAML values as the defaults (TrlParser's
way), so the command line overrides the file; then every value is type-checked (`hf_posenc.domains.matches`)
and the recipe validated (`recipe.validate`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml

from ..errors import PosEncError
from ..domains import matches
from .recipe import SECTIONS, TRAINER_FIELDS, Recipe, unknown_field, validate
from .shipped import recipe_path


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


@functools.cache
def _section_parser() -> type:
    """The parser class, built on first use: transformers is imported only once the YAML, the sections
    and the field names are known to be right, so those mistakes are refused at once."""
    from transformers import HfArgumentParser

    class SectionParser(HfArgumentParser):
        """HfArgumentParser over one section, its values from YAML as defaults (TrlParser's way); argparse's
        errors become PosEncErrors naming the file and the section."""

        def __init__(self, cls: type, values: dict[str, Any], where: str) -> None:
            super().__init__(cls, prog=where, add_help=False, allow_abbrev=False)
            self.where = where
            defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                        for f in dataclasses.fields(cls)}
            self.set_defaults(**{k: v for k, v in {**defaults, **values}.items() if v is not dataclasses.MISSING})
            for action in self._actions:
                action.required = action.required and action.dest not in values

        def error(self, message: str) -> NoReturn:
            raise PosEncError(f"{self.where}: {message}")

    return SectionParser


def _section_values(cls: type, values: Any, where: str) -> dict[str, Any]:
    """A section's YAML mapping, its field names checked (before any section is parsed)."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise PosEncError(f"{where}: a section is a mapping of fields, got {type(values).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    for name in values:
        if name not in names:
            raise unknown_field(name, names, where)
    return values


def _build_section(cls: type, values: dict[str, Any], argv: list[str], where: str) -> Any:
    """The section's dataclass from its checked YAML mapping and its `--field value` overrides, type-checked."""
    try:
        (built,) = _section_parser()(cls, values, where).parse_args_into_dataclasses(argv, look_for_args_file=False)
    except PosEncError:
        raise
    except ValueError as err:  # values left over: `--lr 1 2`
        raise PosEncError(f"{where}: {err}") from None
    for name, tp in typing.get_type_hints(cls).items():
        value = getattr(built, name)
        if not matches(value, tp):
            raise PosEncError(f"{where}.{name}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
        if tp is float:
            setattr(built, name, float(value))
    return built


def _route(overrides: list[str], source: str) -> dict[str, list[str]]:
    """`--section.field v ...` or `--field v ...` (a name only one section has) -> {section: ["--field", "v", ...]}."""
    fields = {section: [f.name for f in dataclasses.fields(cls)] for section, cls in SECTIONS.items()}
    routed: dict[str, list[str]] = {}
    section = None
    for arg in overrides:
        if not arg.startswith("--"):
            if section is None:
                raise PosEncError(f"override {arg!r} must come after --section.field (or --field)")
            routed[section].append(arg)
            continue
        key, sep, value = arg[2:].partition("=")
        name = key.replace("-", "_")
        if "." in name:
            section, name = name.split(".", 1)
            if section not in fields:
                raise unknown_field(section, list(fields), f"{source}: override {arg}")
            if name not in fields[section]:
                raise unknown_field(name, fields[section], f"{source}: override {arg}: {section}")
        else:
            owners = [sec for sec, names in fields.items() if name in names]
            if not owners:
                raise unknown_field(name, [f"{s}.{n}" for s, names in fields.items() for n in names], f"{source}: override {arg}")
            if len(owners) > 1:
                raise PosEncError(f"override {arg} is ambiguous: use one of {', '.join(f'--{o}.{name}' for o in owners)}")
            section = owners[0]
        routed.setdefault(section, []).extend([f"--{name}", value] if sep else [f"--{name}"])
    return routed


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe YAML, apply command-line overrides, validate everything.

    Args:
        path: the YAML file, or a shipped recipe's name (`smollm2-135m/alibi/smoke`, `hf-posenc recipes`).
        overrides: argv-style, e.g. ["--training.lr", "1e-4", "--max_steps", "10", "--peft.target_modules", "q_proj", "v_proj"].
    """
    path = recipe_path(path)
    if not path.is_file():
        raise PosEncError(f"recipe {str(path)!r} not found" + (" (it is a folder; give the YAML file)" if path.is_dir()
                                                                 else "; give a recipe YAML file or a shipped recipe's "
                                                                 "name (`hf-posenc recipes`)"))
    return from_dict(read_yaml(path, "recipe") or {}, source=str(path), overrides=overrides)


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file, or one line naming the file, the line and column, and PyYAML's reason (not its dump)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise PosEncError(f"{path}: the {what} is not a text file; give a YAML file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        reason = " ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None)))) or str(err)
        raise PosEncError(f"{path}: {where}the {what} is not valid YAML ({' '.join(reason.split())})") from None


def from_dict(data: Any, source: str = "<dict>", overrides: list[str] | None = None) -> Recipe:
    """Build and validate a Recipe from a nested mapping (a parsed YAML file) and argv-style overrides."""
    if not isinstance(data, dict):
        raise PosEncError(f"{source}: a recipe is a mapping of sections {', '.join(SECTIONS)}")
    for name in data:
        if name not in SECTIONS and name != "trainer":
            raise unknown_field(name, [*SECTIONS, "trainer"], f"{source}: top level")
    missing = [n for n in ("model", "data", "training", "output") if n not in data]
    if missing:
        raise PosEncError(f"{source}: missing section(s) {', '.join(missing)}")
    routed = _route(overrides or [], source)
    values = {name: _section_values(cls, data.get(name), f"{source}: {name}") for name, cls in SECTIONS.items()}
    sections = {name: _build_section(cls, values[name], routed.get(name, []), f"{source}: {name}")
                for name, cls in SECTIONS.items()}
    return validate(Recipe(**sections, trainer=_trainer_fields(data.get("trainer"), source), source=source))


def _trainer_fields(values: Any, source: str) -> dict[str, Any]:
    """The recipe's `trainer` mapping: fields of transformers' TrainingArguments that no section of the recipe sets,
    checked by TrainingArguments itself (names, then values) before any model or data loads."""
    if not values:
        return {}
    if not isinstance(values, dict):
        raise PosEncError(f"{source}: trainer: a mapping of transformers.TrainingArguments fields, got {values!r:.80}")
    from transformers import TrainingArguments

    names = [f.name for f in dataclasses.fields(TrainingArguments) if f.init and f.name not in TRAINER_FIELDS]
    for name in values:
        if name in TRAINER_FIELDS:
            raise PosEncError(f"{source}: trainer.{name}: the recipe sets it as {TRAINER_FIELDS[name]}; set it there")
        if name not in names:
            raise unknown_field(name, names, f"{source}: trainer (transformers.TrainingArguments)")
    try:
        TrainingArguments(output_dir="unused", **values)
    except (TypeError, ValueError) as err:
        raise PosEncError(f"{source}: trainer: {' '.join(str(err).split())}") from None
    return dict(values)
