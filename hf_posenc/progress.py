"""Progress bars for long work: tqdm's, on in a terminal and off in logs and pipes (`disable=None`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tqdm.auto import tqdm


_ROW: list[str] = []  # the row (model) whose work the bars belong to: `for_row`


@contextlib.contextmanager
def for_row(label: str) -> Iterator[None]:
    """Name every bar made inside the block after `label` ("smollm2 (unpatched): perplexity @ 2048"): an eval
    scores the same cells for several models, and three bars called "perplexity @ 2048" say nothing of which."""
    _ROW.append(label)
    try:
        yield
    finally:
        _ROW.pop()


def bar(iterable: Any = None, *, show: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar that shows (where `show`) only when stderr is a terminal, with an estimate; named after the
    row `for_row` sets, if any.

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
    if _ROW and kwargs.get("desc"):
        kwargs["desc"] = _named(_ROW[-1], kwargs["desc"], columns or shutil.get_terminal_size().columns)
    return tqdm(iterable, **kwargs)


METER = 40  # columns a bar's meter needs besides its name: percentage, a short bar, counts, times and rate


def _named(row: str, desc: str, columns: int) -> str:
    """'row: desc', the row's name shortened where the line would not fit: tqdm cuts an overlong line at the
    terminal's edge, losing the cell and the estimate."""
    room = columns - METER - len(desc) - 2
    if len(row) > room:
        row = row[:max(room - 1, 8)] + "…"
    return f"{row}: {desc}"


def logged(message: str) -> None:
    """One line on stderr where the bars do not show (a log, a pipe): the only sign of progress there, so a
    piped command is not silent until its table."""
    if not sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def status(message: str) -> None:
    """One line on stderr saying what a long step without a bar is doing (importing torch, loading a model,
    setting up a run), so no stretch of a command passes in silence. Like the bars, only in a terminal: in logs
    and pipes stdout keeps the results and stderr only a failure's one line."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def waiting(message: str, every_s: float = 10.0, show: bool = True) -> Iterator[None]:
    """`status(message)`, then a line every `every_s` seconds until the block ends (where `show`): loading a model
    or importing torch takes half a minute on a busy machine and shows no bar of its own."""
    if show:
        status(message)
    done, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(every_s):
            status(f"  ... still {message} ({time.monotonic() - start:.0f} s)")

    thread = threading.Thread(target=beat, daemon=True) if show and sys.stderr.isatty() else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        done.set()


def importing(message: str) -> contextlib.AbstractContextManager[None]:
    """`waiting(message)` around code whose first run imports torch and transformers (5-10 s on a busy machine),
    shown only while they are not imported yet."""
    return waiting(message, show="torch" not in sys.modules)
