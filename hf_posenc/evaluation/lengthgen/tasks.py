"""The algorithmic tasks of Kazemnejad et al. (2023), one registry entry each: an instance of length n is n
symbols in and the answer out, written as words `x1 x2 ... xn >` (the prompt) and ` y1 y2 ... ym .` (the target,
ended by `.` so that stopping is part of the answer). Torch-free.

Lengths count the input symbols, as the paper's do. Every draw is seeded (`random.Random(seed)`): the same
arguments give the same examples on any machine.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence

from ...errors import PosEncError

SYMBOLS = tuple("0123456789")  # the task alphabet: ten single-character words
SEPARATOR = ">"  # ends the prompt: the answer follows
END = "."  # ends the answer


@dataclasses.dataclass(frozen=True)
class LengthTask:
    """One task: `make(rng, n)` draws the input symbols and the answer of an instance of length n;
    `space(n)` is how many distinct instances of length n exist (overlap between splits is only avoided
    where a length has more than the splits need)."""

    name: str
    help: str
    make: Callable[[random.Random, int], tuple[list[str], list[str]]]
    space: Callable[[int], int]


def _random(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(SYMBOLS) for _ in range(n)]


def _repeat(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    symbols = [rng.choice(SYMBOLS)] * n
    return symbols, list(symbols)


def _copy(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    symbols = _random(rng, n)
    return symbols, list(symbols)


def _reverse(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    symbols = _random(rng, n)
    return symbols, symbols[::-1]


def _sort(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    symbols = _random(rng, n)
    return symbols, sorted(symbols)


TASKS: dict[str, LengthTask] = {task.name: task for task in (
    LengthTask("repeat", "copy a string of one repeated symbol (the paper's Copy [repeat])", _repeat,
               lambda n: len(SYMBOLS)),
    LengthTask("copy", "copy a random string", _copy, lambda n: len(SYMBOLS) ** n),
    LengthTask("reverse", "reverse a random string", _reverse, lambda n: len(SYMBOLS) ** n),
    LengthTask("sort", "sort a random string of digits", _sort, lambda n: math.comb(n + len(SYMBOLS) - 1, n)),
)}


@dataclasses.dataclass(frozen=True)
class Example:
    """One instance: the prompt and target as text, its length, and the symbols it was made from."""

    prompt: str
    target: str
    length: int


def task_of(name: str) -> LengthTask:
    """The task called `name`; an unknown name is a PosEncError listing the tasks."""
    if name not in TASKS:
        raise PosEncError(f"unknown length-generalisation task {name!r}; the tasks are {', '.join(TASKS)}")
    return TASKS[name]


def check_lengths(train: Sequence[int], test: Sequence[int]) -> None:
    """Train and test lengths: positive integers, and no test length shorter than the longest train length
    (the study scores lengths past training; the in-distribution check uses the train lengths themselves)."""
    for what, lengths in (("train lengths", train), ("test lengths", test)):
        if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths):
            raise PosEncError(f"{what} must be one or more positive integers (input symbols), got {list(lengths)}")
    if min(test) <= max(train):
        raise PosEncError(f"test lengths must all be longer than the train lengths (the longest is {max(train)}), "
                          f"got {sorted(test)}")


def example(task: LengthTask, rng: random.Random, n: int) -> Example:
    symbols, answer = task.make(rng, n)
    return Example(" ".join([*symbols, SEPARATOR]), " " + " ".join([*answer, END]), n)


def draw(name: str, lengths: Sequence[int], per_length: int, seed: int,
         exclude: frozenset[str] = frozenset()) -> list[Example]:
    """`per_length` examples at each length, distinct and none of whose prompts is in `exclude` (another
    split's) where the length has room for it: at least twice `per_length` instances left after `exclude`."""
    task = task_of(name)
    rng = random.Random(f"{name}-{seed}")
    out: list[Example] = []
    for n in lengths:
        taken = sum(prompt.count(" ") == n for prompt in exclude)  # a prompt of n symbols has n spaces
        room = task.space(n) - taken >= 2 * per_length
        start = len(out)
        seen: set[str] = set()
        while len(seen) < per_length if room else len(out) < start + per_length:
            made = example(task, rng, n)
            if room and (made.prompt in exclude or made.prompt in seen):
                continue
            seen.add(made.prompt)
            out.append(made)
    return out


def split(name: str, train_lengths: Sequence[int], test_lengths: Sequence[int], *, train: int, iid: int,
          test: int, seed: int) -> dict[str, list[Example]]:
    """The three splits of one run: `train` examples spread evenly over the train lengths, `iid` per train length
    and `test` per test length, each split's prompts kept out of the training split where the length allows."""
    check_lengths(train_lengths, test_lengths)
    per = -(-train // len(train_lengths))
    made = draw(name, train_lengths, per, seed)[:train]
    seen = frozenset(e.prompt for e in made)
    return {"train": made, "iid": draw(name, train_lengths, iid, seed + 10_000, seen),
            "ood": draw(name, test_lengths, test, seed + 20_000, seen)}
