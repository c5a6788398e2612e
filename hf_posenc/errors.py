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
