"""Option domains: what values an option takes, declared once beside the option and checked before any
torch code sees the value (no OverflowError, math domain error or NaN logits from a typo).

Torch-free: the CLI refuses a bad option before importing torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .errors import PosEncError


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


def option(default: Any, help: str, domain: Domain | None = None) -> Any:
    """A dataclass field with help text and its domain, peft-style."""
    return dataclasses.field(default=default, metadata={"help": help, "domain": domain})


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
    """Raise PosEncError(message) unless condition holds; the cross-option checks of option dataclasses
    (`__post_init__`), beside the domains of the single options."""
    if not condition:
        raise PosEncError(message)
