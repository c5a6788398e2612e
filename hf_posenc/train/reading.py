"""Reading a recipe: a flat YAML file and `--field value` overrides into a validated `Recipe`.

TRL's `TrlParser` over the recipe's four argument classes, the YAML's values as its defaults (as its `--config`
does), so the command line overrides the file; then every value is type-checked
(`hf_posenc.domains.matches`), TrainingArguments checks its own, and the recipe is validated (`recipe.validate`).
A recipe of the sectioned format before this one is refused, naming the new field of each old one.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml

from ..domains import matches
from ..errors import PosEncError, did_you_mean
from .library import training_fields
from .recipe import OURS, TRAINING_DEFAULTS, Recipe, field_defaults, new_name, validate
from .shipped import recipe_path


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_type_name(a) for a in typing.get_args(tp)))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp):  # `pose`, `distill`: a mapping in the file
        return "mapping"
    return getattr(tp, "__name__", str(tp))


@functools.cache
def _classes() -> dict[str, type]:
    """Our argument classes and transformers' TrainingArguments, by part (transformers imported on first use)."""
    from transformers import TrainingArguments

    return {**OURS, "training": TrainingArguments}


@functools.cache
def field_names() -> dict[str, str]:
    """Every recipe field -> the part that owns it ("model", "data", "posenc", "training"), torch-free."""
    ours = {f.name: part for part, cls in OURS.items() for f in dataclasses.fields(cls)}
    return {**ours, **{name: "training" for name in training_fields()}}


def _check_numbers(data: dict[str, Any], source: str) -> None:
    """A TrainingArguments number given as text that is no number, refused before transformers and torch load
    (YAML reads `1e-3` as text: argparse turns it into a number later)."""
    for name, value in data.items():
        hint = training_fields().get(name)
        if hint in (int, float) and isinstance(value, str):
            try:
                hint(value)
            except ValueError:
                raise PosEncError(f"{source}: {name}: invalid {hint.__name__} value: {value!r}") from None


def _refuse_old_format(data: dict[str, Any], source: str) -> None:
    """A recipe with the sections of the format before this one: refused, naming the new field of each old one."""
    old = [f"{section}.{name} -> {new_name(section, name)}" for section, values in data.items()
           if section in (*OURS, "peft", "training", "evaluation", "output", "trainer") and isinstance(values, dict)
           for name in values]
    if old:
        raise PosEncError(f"{source}: this recipe has the sections of the format before hf-posenc's recipes took "
                          "TrainingArguments' own fields; write each field at the top level under its new name: "
                          + "; ".join(old) + " (docs/guide/train.md)")


def _check_names(names: list[str], where: str) -> None:
    known = field_names()
    for name in names:
        if name not in known:
            raise PosEncError(f"{where}: unknown field {name!r}{did_you_mean(name, list(known))}; the fields are "
                              "those of ModelArguments, DataArguments, PosEncArguments (`hf-posenc train --help`) "
                              "and transformers.TrainingArguments")


def _override_names(overrides: list[str], source: str) -> list[str]:
    """The fields `--name value` overrides name; an old `--section.field` is refused with its new name."""
    names = []
    for arg in overrides:
        if not arg.startswith("--"):
            continue
        name = arg[2:].partition("=")[0].replace("-", "_")
        if "." in name:
            section, _, old = name.partition(".")
            raise PosEncError(f"{source}: override {arg.partition('=')[0]}: fields have no sections now; "
                              f"use --{new_name(section, old).split(' ')[0]}")
        names.append(name.removeprefix("no_") if name.startswith("no_") and name not in field_names() else name)
    _check_names(names, f"{source}: override")
    return names


@functools.cache
def _parser_class() -> type:
    from trl import TrlParser

    class RecipeParser(TrlParser):
        """TRL's parser, whose errors are PosEncErrors naming the file."""

        where = ""

        def error(self, message: str) -> NoReturn:
            raise PosEncError(f"{self.where}: {message}")

    return RecipeParser


def _parse(values: dict[str, Any], overrides: list[str], source: str) -> dict[str, Any]:
    """Every field's value: the class default, under TRAINING_DEFAULTS, under the YAML, under the command line."""
    parser = _parser_class()(list(_classes().values()), prog=source, add_help=False, allow_abbrev=False)
    parser.where = source
    # the YAML's values as the parser's defaults (TRL's `--config`); the field defaults given again, as the parser
    # loses some (`str | list[str]`)
    parser.set_defaults_with_config(**{**field_defaults(), **TRAINING_DEFAULTS, **values})
    try:
        return vars(parser.parse_args(overrides))
    except PosEncError:
        raise
    except ValueError as err:  # values left over: `--learning_rate 1 2`
        raise PosEncError(f"{source}: {err}") from None


def _typed(cls: type, parsed: dict[str, Any], names: set[str], source: str) -> dict[str, Any]:
    """The values of `cls`'s fields among `names`, each checked against its type hint."""
    hints, kept = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.init and f.name in names:
            value = parsed[f.name]
            if not matches(value, hints[f.name]):
                raise PosEncError(f"{source}: {f.name}: expected {_type_name(hints[f.name])}, got {value!r} "
                                  f"({type(value).__name__})")
            choices = [e.value for arg in typing.get_args(hints[f.name]) if isinstance(arg, enum.EnumMeta) for e in arg]
            if choices and value not in choices and isinstance(value, str):  # TrainingArguments' enums
                raise PosEncError(f"{source}: {f.name}: {value!r} is not one of {', '.join(map(repr, choices))}")
            kept[f.name] = float(value) if hints[f.name] is float else value
    return kept


def _check_training(cls: type, fields: dict[str, Any], source: str) -> None:
    """TrainingArguments' own checks of the recipe's fields, by building it as on CPU (the launch picks the device,
    and the machine that reads a recipe may not have it). Building it sets up accelerate's process state: on the
    state there is (a notebook's own Accelerator stays), else on a single process's, cleared after. A process of a
    multi-process launch leaves it to the run (`runner._arguments`, before the model loads): set up here, the state
    would be a CPU one."""
    from accelerate import PartialState
    from accelerate.state import AcceleratorState

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return
    existed = bool(PartialState._shared_state)
    configured = {"accelerator_config": {"use_configured_state": True}} if existed else {}
    try:
        cls(**{**fields, "use_cpu": True, **({} if "accelerator_config" in fields else configured)})
    except (TypeError, ValueError) as err:
        raise PosEncError(f"{source}: {' '.join(str(err).split())}") from None
    finally:
        if not existed:
            AcceleratorState._reset_state(reset_partial_state=True)


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe YAML, apply command-line overrides, validate everything.

    Args:
        path: the YAML file, or a shipped recipe's name (`smollm2-135m/alibi/smoke`, `hf-posenc recipes`).
        overrides: argv-style, e.g. ["--learning_rate", "1e-4", "--max_steps=10", "--lora_target_modules", "q_proj", "v_proj"].
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
    """Build and validate a Recipe from a flat mapping (a parsed YAML file) and argv-style overrides."""
    if not isinstance(data, dict):
        raise PosEncError(f"{source}: a recipe is a mapping of fields (model_name_or_path, dataset_name, scheme, "
                          "learning_rate, max_steps, output_dir, ...)")
    _refuse_old_format(data, source)
    overrides = overrides or []
    given = {*_override_names(overrides, source), *data}
    _check_names(list(data), source)
    _check_numbers(data, source)
    parsed = _parse(data, overrides, source)
    parts = {part: cls(**_typed(cls, parsed, {f.name for f in dataclasses.fields(cls)}, source))
             for part, cls in OURS.items()}
    training_cls = _classes()["training"]
    fields = _typed(training_cls, parsed, {n for n, part in field_names().items()
                                           if part == "training" and (n in given or n in TRAINING_DEFAULTS)}, source)
    if not fields.get("output_dir"):
        raise PosEncError(f"{source}: output_dir: required (the run folder: the model, checkpoints/, results.json)")
    _check_training(training_cls, fields, source)
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(training_cls) if f.init}
    return validate(Recipe(**parts, training=types.SimpleNamespace(**{**defaults, **fields}), trainer_fields=fields,
                           source=source))

