"""PosEncConfig: the only state a patch saves (as `config.posenc` in config.json)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from .errors import PosEncError

FORMAT = 1


class PosEncConfig:
    """Which positional scheme a model uses, with validated options.

    Args:
        scheme: a name from `hf_posenc.list_schemes()`.
        stacks: encoder-decoder models only: which attention stacks take the scheme, a subset of
            `STACKS` (default: every text stack of the model). Not a scheme option: it says where, not what.
        **options: the scheme's options (e.g. `theta=1e4`, `factor=4.0`); unknown names are an error.
    """

    def __init__(self, scheme: str, stacks: Any = None, **options: Any) -> None:
        from .registry import get_scheme

        spec = get_scheme(scheme)
        self.scheme = spec.name
        self.stacks = _check_stacks(stacks)
        self.options = spec.validate(options)

    def to_dict(self, original: str | None = None) -> dict[str, Any]:
        out = {"format": FORMAT, "scheme": self.scheme, "options": dict(self.options), "from": original}
        return {**out, "stacks": list(self.stacks)} if self.stacks is not None else out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PosEncConfig":
        if not isinstance(data, dict) or "scheme" not in data:
            raise PosEncError(f"not a hf-posenc config: {data!r}; expected a dict with 'format', 'scheme', 'options'")
        version = data.get("format", FORMAT)
        if not isinstance(version, int) or version > FORMAT:
            raise PosEncError(
                f"config.posenc has format {version!r}, written by a newer hf-posenc; this version reads "
                f"format <= {FORMAT}. Upgrade with `pip install -U hf-posenc`."
            )
        return cls(data["scheme"], stacks=data.get("stacks"), **data.get("options", {}))

    def replace(self, **options: Any) -> "PosEncConfig":
        stacks = options.pop("stacks", self.stacks)
        return PosEncConfig(self.scheme, stacks=stacks, **{**self.options, **options})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PosEncConfig) and \
            (self.scheme, self.stacks, self.options) == (other.scheme, other.stacks, other.options)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        where = f", stacks={self.stacks!r}" if self.stacks is not None else ""
        return f"PosEncConfig(scheme={self.scheme!r}{where}{', ' if opts else ''}{opts})"


STACKS = ("encoder", "decoder")  # the attention stacks of an encoder-decoder model, in the order they run


def _check_stacks(stacks: Any) -> tuple[str, ...] | None:
    """None, or a non-empty subset of STACKS in their order (from a tuple, a list or one name)."""
    if stacks is None:
        return None
    names = [stacks] if isinstance(stacks, str) else stacks
    if not isinstance(names, (list, tuple)) or not names or any(n not in STACKS for n in names):
        raise PosEncError(f"stacks must be a non-empty list of {', '.join(map(repr, STACKS))}, got {stacks!r}")
    return tuple(n for n in STACKS if n in names)


def validate_options(scheme: str, options_cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """Build the scheme's options dataclass, turning every mistake into a PosEncError."""
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        allowed = ", ".join(fields) or "no options"
        raise PosEncError(f"scheme {scheme!r} has no option {', '.join(map(repr, unknown))}; it takes: {allowed}")
    hints = typing.get_type_hints(options_cls)
    for name, value in options.items():
        if not _accepts(value, hints[name]):
            raise PosEncError(f"scheme {scheme!r}: {name} must be {_expected(hints[name])}, got {value!r}")
    try:
        return dataclasses.asdict(options_cls(**options))
    except (TypeError, ValueError) as err:
        if isinstance(err, PosEncError):
            raise
        raise PosEncError(f"scheme {scheme!r}: {err}") from err


def _accepts(value: Any, hint: Any) -> bool:
    """Whether an option value has its declared type; True is not a number here (bool subclasses int)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_accepts(value, arg) for arg in args)
    if origin is Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(_accepts(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return not isinstance(value, bool) and isinstance(value, int if hint is int else (int, float))
    return isinstance(value, hint) if isinstance(hint, type) else True


def _expected(hint: Any) -> str:
    """How an option's type reads in an error message: 'a number', 'an integer or null', ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(arg) for arg in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is list:
        return f"a list of {_expected(args[0]).split(' ', 1)[1]}s"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def check(condition: bool, message: str) -> None:
    """Raise PosEncError(message) unless condition holds; used by option dataclasses."""
    if not condition:
        raise PosEncError(message)


def option(default: Any, help: str) -> Any:
    """A dataclass field with help text, peft-style."""
    return dataclasses.field(default=default, metadata={"help": help})
