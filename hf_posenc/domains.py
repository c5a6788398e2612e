"""Option domains: what values an option takes (its type, its range, the bounds it shares with other options or
the model), declared once beside the option and checked here, once, before any torch code sees the value (no
OverflowError, math domain error or NaN logits from a typo). Also the one type checker of recipe fields.

Torch-free: the CLI refuses a bad option before importing torch.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Union

from .errors import PosEncError, did_you_mean


@dataclass(frozen=True)
class Domain:
    """A finite number (or an integer, or a list of numbers) within bounds, or one of some choices.

    `low`/`high` are inclusive unless `low_open`/`high_open`. Bounds that depend on the model name one of
    `FACTS`: `below` (the value is < that fact), `entries` (the list has that many entries); `check_facts`
    checks them, when patching against the model and in the CLI against its config.json, torch-free.
    """

    kind: type  # float, int, str or list (of floats)
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    source: str = ""  # where the range comes from (paper, transformers)
    below: str = ""  # a fact of the model (FACTS) the value must stay under: concat's d_pos, the hidden size
    entries: str = ""  # a fact of the model (FACTS) that is the list's length: LongRoPE's factors, one per pair

    def text(self) -> str:
        """The domain as an error message and `hf-posenc list --scheme` say it: 'a number > 0', ..."""
        if self.choices:
            return "one of " + repr(self.choices)
        noun = {int: "an int", float: "a number", list: "a list of numbers"}[self.kind]
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {_num(self.low)}")
        if self.high is not None:
            bounds.append(f"{'<' if self.high_open else '<='} {_num(self.high)}")
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{noun} in {left}{_num(self.low)}, {_num(self.high)}{right}"
        each = ", each " if self.kind is list and bounds else " " if bounds else ""
        return f"{noun}{each}{' and '.join(bounds)}".rstrip() + ("" if bounds or self.kind is list else " (finite)")

    def problem(self, value: Any) -> str | None:
        """None if `value` (already of the declared type, not None) is in the domain, else what is wrong."""
        if self.choices:
            return None if value in self.choices else "not one of them"
        for item in value if self.kind is list else [value]:
            if not finite(item):
                return "not finite"
            if self.low is not None and (item <= self.low if self.low_open else item < self.low):
                return "below the range"
            if self.high is not None and (item >= self.high if self.high_open else item > self.high):
                return "above the range"
        return None

    def outside(self) -> Any:
        """A value of the right type outside the domain (for the meta-test), or None if every one is inside."""
        if self.choices:
            return "no-such-choice"
        if self.low is not None:
            item = self.low - (0 if self.low_open else 1)
        elif self.high is not None:
            item = self.high + (0 if self.high_open else 1)
        else:
            return None
        item = int(item) if self.kind is int else float(item)
        return [item] if self.kind is list else item


def finite(value: Any) -> bool:
    """A number a float can hold: not inf, not nan, and no int too large for a float."""
    try:
        return math.isfinite(float(value))
    except (OverflowError, TypeError, ValueError):
        return False


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def positive(source: str = "") -> Domain:
    return Domain(float, low=0, low_open=True, source=source)


def at_least(low: float, kind: type = float, source: str = "") -> Domain:
    return Domain(kind, low=low, source=source)


def between(low: float, high: float, low_open: bool = False, high_open: bool = False, source: str = "") -> Domain:
    return Domain(float, low=low, high=high, low_open=low_open, high_open=high_open, source=source)


def one_of(*choices: str) -> Domain:
    return Domain(str, choices=choices)


def option(default: Any, help: str, domain: Domain | None = None, flag: str | None = None) -> Any:
    """A dataclass field with help text and its domain, peft-style; `flag`: its name on the command line where
    that is not the field's (a suite's `--GROUP.flag`)."""
    return dataclasses.field(default=default, metadata={"help": help, "domain": domain,
                                                        **({"flag": flag} if flag else {})})


def domain_of(field: dataclasses.Field) -> Domain | None:
    return field.metadata.get("domain")


def rotary_pairs(facts: Mapping[str, Any], options: Mapping[str, Any]) -> int | None:
    """Frequency pairs a rotation has: head_dim * partial / 2, `partial` the option or else the model's own."""
    partial = options.get("partial") if options.get("partial") is not None else facts.get("partial")
    return None if facts.get("head_dim") is None or partial is None else int(facts["head_dim"] * partial) // 2


# The model facts a domain can name: how a message says it, and its value from the facts (`ModelFacts.named()`
# when patching, `hf_posenc.cli.checks.config_facts` from config.json: None where unknown, then not checked
# here but when patching) and the options.
FACTS: dict[str, tuple[str, Callable[[Mapping[str, Any], Mapping[str, Any]], int | None]]] = {
    "hidden_size": ("the hidden size", lambda facts, options: facts.get("hidden_size")),
    "rotary_pairs": ("head_dim*partial/2", rotary_pairs),
}


def check_facts(options_cls: type | None, options: Mapping[str, Any], facts: Mapping[str, Any]) -> None:
    """The bounds of `options_cls`'s domains that name a model fact, for `options` (a scheme's, already
    checked against their own domains) on a model with `facts`; PosEncError on the first one broken."""
    for field in dataclasses.fields(options_cls) if dataclasses.is_dataclass(options_cls) else ():
        domain, value = domain_of(field), options.get(field.name)
        if domain is None or value is None:
            continue
        if domain.below and (limit := FACTS[domain.below][1](facts, options)) is not None:
            check(value < limit, f"{field.name} must be < {FACTS[domain.below][0]} {limit}, got {value}")
        if domain.entries and (count := FACTS[domain.entries][1](facts, options)) is not None:
            check(len(value) == count,
                  f"{field.name} must have {count} entries ({FACTS[domain.entries][0]}), got {len(value)}")


def check(condition: bool, message: str) -> None:
    """Raise PosEncError(message) unless condition holds: the model-fact bounds of `check_facts`, and checks a
    user scheme's options dataclass may make in `__post_init__` (built-ins declare theirs as `Relation`s)."""
    if not condition:
        raise PosEncError(message)


OPERATORS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass(frozen=True)
class Relation:
    """A bound one option puts on another (YaRN's beta_slow < beta_fast), declared beside the options as their
    domains are, so that it is data: the torch-free snapshot of the built-in schemes' options carries it too.

    `left op right * times` must hold whenever both sides are set (not None) and `when` = (option, value)
    holds; `right` is another option's name or a number. `message` says what must hold; it is formatted with
    the options and `bound` (right * times, as a number reads)."""

    left: str
    op: str  # one of OPERATORS
    right: str | float
    message: str
    times: float = 1.0
    when: tuple[str, Any] | None = None

    def problem(self, options: dict[str, Any]) -> str | None:
        """None if the relation holds for `options` (every option's value, defaults filled), else the message."""
        if self.when is not None and options.get(self.when[0]) != self.when[1]:
            return None
        left = options.get(self.left)
        right = options.get(self.right) if isinstance(self.right, str) else self.right
        if left is None or right is None:
            return None
        bound = right * self.times
        return None if OPERATORS[self.op](left, bound) else self.message.format(**options, bound=_num(bound))


def relations_of(options_cls: type) -> tuple[Relation, ...]:
    """The cross-option bounds an options dataclass declares (a class attribute `relations`, not a field)."""
    return tuple(getattr(options_cls, "relations", ()))


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


def validate(scheme: str, options_cls: type, options: dict[str, Any], checked: Mapping[str, Any] | None = None,
             facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Build the scheme's options dataclass, turning every mistake into a PosEncError naming the scheme,
    the option and its domain (type, finite, range, relations; with `facts`, the bounds naming a model fact).

    `checked`: values validated before (a config's own, now resolved against a model): an option that still has
    its value there is not checked again, so each value is checked once."""
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(options) - set(fields), key=str)
    if unknown:
        allowed = ", ".join(fields) or "no options"
        hint = did_you_mean(unknown[0], fields) if len(unknown) == 1 else ""
        raise PosEncError(f"scheme {scheme!r} has no option {', '.join(map(repr, unknown))}{hint}; it takes: {allowed}")
    hints = typing.get_type_hints(options_cls)
    for name, field in fields.items():
        value = options.get(name, field.default)
        if checked is not None and name in checked and checked[name] == value:
            continue
        domain = domain_of(field)
        allowed = domain.text() if domain else expected(hints[name])
        if value is dataclasses.MISSING or (value is None and not matches(None, hints[name])):
            raise PosEncError(f"scheme {scheme!r}: option {name!r} is required ({allowed})")
        nullable = " or null" if matches(None, hints[name]) and value is not None else ""
        if not matches(value, hints[name]) or not _all_finite(value):
            raise PosEncError(f"scheme {scheme!r}: {name} must be {allowed}{nullable}, got {value!r}")
        if value is not None and domain is not None and (problem := domain.problem(value)) is not None:
            raise PosEncError(f"scheme {scheme!r}: {name} must be {allowed}{nullable}, got {value!r} ({problem})")
    values = {name: options.get(name, field.default) for name, field in fields.items()}
    for relation in relations_of(options_cls):
        if (problem := relation.problem(values)) is not None:
            raise PosEncError(f"scheme {scheme!r}: {problem}")
    try:
        check_facts(options_cls, values, facts or {})
    except PosEncError as err:
        raise PosEncError(f"scheme {scheme!r}: {err}") from err
    try:
        return dataclasses.asdict(options_cls(**options))
    except (TypeError, ValueError) as err:  # a user scheme's own checks in __post_init__
        raise PosEncError(f"scheme {scheme!r}: {err}") from err


def _all_finite(value: Any) -> bool:
    """Numbers (and numbers in lists) must be finite whatever the option: inf and nan only ever become NaN logits."""
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return finite(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else True


def expected(hint: Any) -> str:
    """How an option's type reads in an error message: 'a number', 'an integer or null', ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(expected(arg) for arg in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is list:
        return f"a list of {expected(args[0]).split(' ', 1)[1]}s"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))
