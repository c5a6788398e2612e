"""Progress bars for long work: tqdm's, on in a terminal and off in logs and pipes (`disable=None`)."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from tqdm.auto import tqdm


def bar(iterable: Any = None, *, show: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar that shows (where `show`) only when stderr is a terminal, with an estimate.

    A pseudo-terminal can report 0 columns (`script`, some CI runners and IDE consoles); tqdm then draws
    nothing (no rows) or empty lines (no columns), so the size falls back to $COLUMNS/$LINES or 80 x 24 there.
    """
    kwargs.setdefault("disable", None if show else True)
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):  # not a terminal (the bar is off then) or no file number
        columns = None
    if columns == 0:
        size = shutil.get_terminal_size()
        kwargs.setdefault("ncols", size.columns)
        kwargs.setdefault("nrows", size.lines)
    else:
        kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)


def status(message: str) -> None:
    """One line on stderr saying what a long step without a bar is doing (importing torch, loading a model,
    setting up a run), so no stretch of a command passes in silence. Like the bars, only in a terminal: in logs
    and pipes stdout keeps the results and stderr only a failure's one line."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)
