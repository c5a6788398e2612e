"""Argument types the subcommands share: `--opt key=value`, `--patch SCHEME` with its options and layers, comma
lists. Torch-free; each turns a bad value into a PosEncError naming the flag (exit 2)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import PosEncError


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """`k=v` strings to scheme options; values are read as JSON where they parse (numbers, lists,
    true/false, null), else kept as strings -- the scheme's option types then say what fits."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PosEncError(f"--opt takes key=value, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def scheme_config(scheme: str | None, options: dict[str, Any], layers: str | None = None) -> Any:
    """The validated `PosEncConfig` of a scheme name, its `--opt`s and `--layers`, before any model loads."""
    from ..config import PosEncConfig

    if scheme is None:
        if options or layers is not None:
            raise PosEncError("--opt and --layers need --patch SCHEME to apply to")
        return None
    return PosEncConfig(scheme, layers=layer_list(layers) if layers is not None else None, **options)


def layer_list(text: str) -> list[int]:
    """'3,7,11' -> [3, 7, 11]: layer indices count from 0."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise PosEncError(f"--layers takes comma-separated layer indices such as 3,7,11, got {text!r}") from err


def int_list(text: str, what: str) -> list[int]:
    """'512,1024' -> [512, 1024]; each must be a positive integer."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise PosEncError(f"{what}s must be comma-separated integers, got {text!r}") from err
    if not values or any(v <= 0 for v in values):
        raise PosEncError(f"{what}s must be positive integers, got {text!r}")
    return values


def float_list(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise PosEncError(f"{what}s must be comma-separated numbers, got {text!r}") from err
