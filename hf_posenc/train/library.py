"""transformers.TrainingArguments' fields and their types, read from transformers' source without importing it:
importing TrainingArguments imports torch, and a misspelt or mistyped recipe field is refused before that
(seconds on a cold start). `reading` parses with the class itself once these checks pass."""

from __future__ import annotations

import ast
import functools
import importlib.util
import typing
from pathlib import Path
from typing import Any


class _Names(dict):
    """Names an annotation uses: typing's, and `str` for the enums TrainingArguments' fields also take as strings."""

    def __missing__(self, name: str) -> Any:
        return str


@functools.cache
def training_fields() -> dict[str, Any]:
    """TrainingArguments' init fields -> their type hints, as its source declares them."""
    package = Path(importlib.util.find_spec("transformers").origin).parent  # found, not imported
    tree = ast.parse((package / "training_args.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingArguments")
    names = _Names(vars(typing), dict=dict, list=list, int=int, float=float, bool=bool, str=str)
    fields = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        call = node.value
        if isinstance(call, ast.Call) and any(k.arg == "init" and getattr(k.value, "value", True) is False
                                              for k in call.keywords):
            continue
        try:
            fields[node.target.id] = eval(ast.unparse(node.annotation), {"__builtins__": {}}, names)  # noqa: S307
        except TypeError:  # `A | B` of names that are not classes here
            fields[node.target.id] = Any
    return fields
