"""The `eval` flags of the registered suites: one argument group per suite settings class, a flag per field (its
help, type and default), checked against each field's domain; and the suites of your own that `eval` imports
first (`--suite-module`, and the `hf_posenc.suites` entry points of installed packages). Torch-free."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys
import typing
from pathlib import Path
from typing import Any

from ..errors import PosEncError
from .arguments import float_list, int_list

ENTRY_POINTS = "hf_posenc.suites"  # installed packages' suites: [project.entry-points."hf_posenc.suites"]


def import_suite_modules(argv: list[str] | None) -> None:
    """Import the suites of installed packages (entry points) and of every `--suite-module` in `argv`, so their
    flags are in the parser and their names in `--suite`. A plug-in that fails to import or to register (a name or
    table another suite has) is said by name on stderr and skipped: one broken plug-in never stops the others."""
    argv = argv or []
    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--suite-module"]
    named += [a.partition("=")[2] for a in argv if a.startswith("--suite-module=")]
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        _import(entry.value, entry.load)
    for name in named:
        _import(name, lambda name=name: _load(name))


def _import(name: str, load: Any) -> None:
    try:
        load()
    except Exception as err:  # a plug-in's own failure, said in one line; the other suites run
        print(f"hf-posenc: suite module {name} skipped: {type(err).__name__}: {err}", file=sys.stderr)


def _load(name: str) -> None:
    """A module by name (`my_suites.bleu`), or a .py file by path, imported once as its file name."""
    if not name.endswith(".py"):
        importlib.import_module(name)
        return
    path = Path(name).resolve()
    if path.stem in sys.modules and getattr(sys.modules[path.stem], "__file__", None) == str(path):
        return
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or not path.is_file():
        raise PosEncError(f"{name} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]  # a module that failed is not imported
        raise


def _item_type(hint: Any) -> tuple[Any, bool]:
    """(the type a flag parses, whether it is a comma list) of a settings field's type hint."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (tuple, list):
        return args[0], True
    return (args[0] if args and origin is not typing.Literal else hint), False


def add_suite_flags(parser: argparse.ArgumentParser) -> None:
    """An argument group per settings group (titled by the suites that take it), a flag `--GROUP.FIELD` per field,
    its value kept as `GROUP.FIELD` on the parsed arguments."""
    from ..evaluation.suite import flag, setting_groups

    for name, (settings, suites) in setting_groups().items():
        group = parser.add_argument_group(f"suite {', '.join(suites)} (--{name.replace('_', '-')}.*)",
                                          (settings.__doc__ or "").strip() or None)
        hints = typing.get_type_hints(settings)
        for field in dataclasses.fields(settings):
            kind, many = _item_type(hints[field.name])
            extra = {"metavar": field.metadata.get("metavar", field.name.upper())}
            if typing.get_origin(hints[field.name]) is typing.Literal:
                extra["choices"] = typing.get_args(hints[field.name])
            if kind is bool and not many:
                group.add_argument(flag(name, field), dest=f"{name}.{field.name}", default=field.default,
                                   action=argparse.BooleanOptionalAction, help=field.metadata.get("help"))
                continue
            default = ",".join(map(str, field.default)) if many else field.default
            group.add_argument(flag(name, field), dest=f"{name}.{field.name}", default=default,
                               type=str if many or kind not in (int, float) else kind,
                               help=field.metadata.get("help"), **extra)


def suite_values(args: argparse.Namespace, suites: list[str]) -> dict[str, dict[str, Any]]:
    """Every suite setting from the flags (comma lists parsed), each in its domain; then the suites that run check
    their settings' relations (`Suite.check`). Returns the values by group and field name."""
    from ..evaluation.suite import check_domains, group_of, setting_groups, suite_of

    values: dict[str, dict[str, Any]] = {}
    built: dict[str, Any] = {}
    for name, (settings, _) in setting_groups().items():
        hints, own = typing.get_type_hints(settings), {}
        for field in dataclasses.fields(settings):
            value = getattr(args, f"{name}.{field.name}")
            kind, many = _item_type(hints[field.name])
            if many and isinstance(value, str):
                noun = field.name.replace("_", " ").removesuffix("s")
                value = tuple(int_list(value, noun) if kind is int else float_list(value, noun))
            own[field.name] = value
        values[name], built[name] = own, settings(**own)
        check_domains(name, built[name])
    for suite_name in suites:
        suite, _ = suite_of(suite_name)
        suite.check(built.get(group_of(suite)), args.lengths)
    return values
