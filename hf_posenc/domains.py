"""Option domains: what values an option takes, declared once beside the option and checked before any
torch code sees the value (no OverflowError, math domain error or NaN logits from a typo).

Torch-free: the CLI refuses a bad option before importing torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .errors import PosEncError


@dataclass(frozen=True)
class Domain:
    """A finite number (or an integer, or a list of numbers) within bounds, or one of some choices.

    `low`/`high` are inclusive unless `low_open`/`high_open`; `length` is the list length, when the
    scheme alone fixes it (LongRoPE's depends on the model: checked against it when patching).
    """

    kind: type  # float, int, str or list (of floats)
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    source: str = ""  # where the range comes from (paper, transformers)

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


def check(condition: bool, message: str) -> None:
    """Raise PosEncError(message) unless condition holds; the cross-option checks of option dataclasses
    (`__post_init__`), beside the domains of the single options."""
    if not condition:
        raise PosEncError(message)
