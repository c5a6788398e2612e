"""Whether a parsed value has a declared type: the one checker of scheme options (`config`) and recipe
fields (`train.recipe`). A leaf: it imports nothing of the package."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union


def matches(value: Any, hint: Any) -> bool:
    """Whether `value` (from YAML, JSON or argv) has the type `hint`: unions, Literal, list[...], dict[...],
    None and plain classes. True is not a number here (bool subclasses int); an int is a float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(matches(value, arg) for arg in args)
    if origin is Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return not isinstance(value, bool) and isinstance(value, int if hint is int else (int, float))
    return isinstance(value, hint) if isinstance(hint, type) else True
