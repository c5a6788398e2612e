"""The one exception type users see for their own mistakes, and the hint a misspelt name gets."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PosEncError(ValueError):
    """A user mistake: unknown scheme or architecture, bad option, input past a limit.

    The message always names what was wrong and what is allowed instead.
    """


def did_you_mean(name: object, allowed: Iterable[str]) -> str:
    """" (did you mean 'yarn'?)" when one allowed name is close to `name`, else "": a typo gets its fix
    (scheme names, scheme options, recipe fields alike)."""
    close = difflib.get_close_matches(str(name), list(allowed), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Unsupported(PosEncError):
    """A model (or one of its stacks, or layers) that cannot take a scheme: the message as `patch` says it, and
    its parts for the callers that say it their own way (the CLI, a recipe): the scheme, why not, and what the
    model takes instead."""

    def __init__(self, message: str, scheme: str = "", reason: str = "", supported: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.scheme, self.reason, self.supported = scheme, reason, tuple(supported)
