"""The task splits of Kazemnejad et al. (2023) as their generators define them, for the study at the paper's
conditions (issue 57). Their repository (github.com/McGill-NLP/length-generalization, `scripts/dataset_builders/
make_*_dataset.py` and `src/data/data_instance_processor/*`) is the source of each definition, symbol count and
length range below; the paper's own split names are kept. Torch-free.

What is theirs: the task, its prompt words (each prompt starts with a fixed word -- "Copy:", "Reverse:",
"Compute", ... -- the fixed first token that NoPE's construction relies on; their sequences have no other BOS),
the symbol counts (100 for the copy and reverse variants, 50 for single-token sort), the lengths (copy and reverse:
train 2-20, test 21-40; the `*_tr8_ts16` tasks: train up to 8, test 9-16) and answers digit by digit. What differs:
symbols are the words `w00`...`w99` of a word-level vocabulary (theirs are T5 pieces, which only they can draw
reproducibly: the list depends on the tokenizer's vocabulary order); the prompt ends with `>` and the answer with
`.` (their separators are `[SEP]` or nothing, their answers end with `</s>` and some start with "The answer is");
repeat-one-symbol draws from the same 100 symbols (theirs from ~6,000, one per example). SCAN and PCFG are left
out: their data comes from the Hub and GitHub, out of reach here.

Held-out examples (in distribution: the gate; out of distribution: the score) are drawn first; training draws
never produce one of their prompts, even where a length has few distinct instances (repeat one symbol: 100).
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Callable, Sequence

from hf_posenc.errors import PosEncError
from hf_posenc.evaluation.lengthgen.tasks import END, SEPARATOR, Example

SYMBOLS = tuple(f"w{i:02d}" for i in range(100))  # the copy and reverse variants' 100 symbols
SORT_SYMBOLS = SYMBOLS[:50]  # single-token sort: 50 symbols, ordered by their index (as theirs sorts token ids)
LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")  # LEGO's variables
NEXT = "[NEXT]"  # between the two halves of the 2x and reverse-then-copy answers
COPY_LENGTHS = (tuple(range(2, 21)), tuple(range(21, 41)))  # their copy/reverse splits: *_tr20_ts40
SHORT = tuple(range(9, 17))  # the *_tr8_ts16 test lengths

Make = Callable[[random.Random, int], tuple[list[str], list[str]]]  # length -> (prompt words, answer words)


@dataclasses.dataclass(frozen=True)
class PaperTask:
    """One of their splits: `make(rng, n)` draws the prompt and answer words of an instance of length n (what
    their generator counts: symbols, digits of the longer operand, terms, items, variables)."""

    name: str  # their split's name, e.g. "cmc" (s2s_copy/cmc_tr20_ts40)
    help: str
    make: Make
    train_lengths: tuple[int, ...]
    test_lengths: tuple[int, ...]


def _digits(value: int) -> list[str]:
    """A number digit by digit, as their `number_to_string` writes it (a minus sign its own word)."""
    return (["-"] if value < 0 else []) + list(str(abs(value)))


def _number(rng: random.Random, digits: int) -> int:
    """Uniform over the numbers of exactly `digits` digits (0-9 for one), as their addition draws operands."""
    return rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def _rsc(twice: bool) -> Make:
    def make(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
        s = rng.choice(SYMBOLS)
        return ["Copy:", *[s] * n], [s] * (2 * n if twice else n)
    return make


def _rdc(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    a, b = rng.sample(SYMBOLS, 2)
    return ["Replace", a, "with", b, "in", *[a] * n], [b] * n


def _sequence(word: str, answer: Callable[[list[str]], list[str]]) -> Make:
    def make(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
        xs = [rng.choice(SYMBOLS) for _ in range(n)]
        return [word, *xs], answer(xs)
    return make


def _addition(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    """n: the longer operand's digits (their category "a-by-b" read as max(a, b)); the other has 1..n."""
    sizes = [n, rng.randint(1, n)]
    rng.shuffle(sizes)
    a, b = (_number(rng, d) for d in sizes)
    return ["Compute", *_digits(a), "+", *_digits(b), "?"], _digits(a + b)


def _sum(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    values = [rng.randint(1, 9) for _ in range(n)]
    words = [w for v in values for w in ("+", str(v))][1:]
    return ["Compute:", *words], [str(sum(values) % 10)]


def _parity(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    bits = [rng.randint(0, 1) for _ in range(n)]
    return ["Is", "even", "[", *map(str, bits), "]", "?"], ["Yes" if sum(bits) % 2 == 0 else "No"]


def _sort_single(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    items = [rng.choice(SORT_SYMBOLS) for _ in range(n)]
    return ["Sort", "[", *items, "]"], sorted(items, key=SORT_SYMBOLS.index)


def _sort_multi(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    """Integers of 2-4 digits (their randint(10, 10000)), digit by digit, items separated by commas."""
    values = [rng.randrange(10, 10_000) for _ in range(n)]

    def listed(vs: Sequence[int]) -> list[str]:
        return [w for v in vs for w in (",", *_digits(v))][1:]
    return ["Sort", "[", *listed(values), "]"], listed(sorted(values))


def _poly(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    """n terms c * x ** d (c in -3..3, d in 0..3) at x in -2..2, the value mod 10 (Python's, so 0-9)."""
    x = rng.randint(-2, 2)
    terms = [(rng.randint(-3, 3), rng.randint(0, 3)) for _ in range(n)]
    words = [w for c, d in terms for w in ("+", *_digits(c), "*", "x", "**", str(d))][1:]
    return ["Evaluate", "x", "=", *_digits(x), "in", *words], [str(sum(c * x**d for c, d in terms) % 10)]


def _lego(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    """A chain of n variables (a permutation of letters): the first is +1, each next is + or - the one before;
    the question asks one of the later half's values (their query index from ceil(n/2) to n-1)."""
    names = rng.sample(LETTERS, n)
    value, words = 1, ["If", names[0], "=", "+1"]
    values = [value]
    for prev, name in zip(names, names[1:]):
        sign = rng.choice("+-")
        value = value if sign == "+" else -value
        values.append(value)
        words += [",", name, "=", sign, prev]
    query = rng.randint(-(-n // 2), n - 1)
    return [*words, "?", names[query]], ["+1" if values[query] > 0 else "-1"]


def _tr8(low: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(range(low, 9)), SHORT


PAPER_TASKS: dict[str, PaperTask] = {task.name: task for task in (
    PaperTask("rsc", "copy: one symbol repeated (Copy variant 1)", _rsc(False), *COPY_LENGTHS),
    PaperTask("rsc2x", "copy one repeated symbol twice as long (variant 1, 2x)", _rsc(True), *COPY_LENGTHS),
    PaperTask("rdc", "replace a repeated symbol by another (variant 2)", _rdc, *COPY_LENGTHS),
    PaperTask("cmc", "copy a string of 100 symbols (variant 3)", _sequence("Copy:", list), *COPY_LENGTHS),
    PaperTask("cmc2x", "copy a string twice (variant 3, 2x)", _sequence("Copy:", lambda xs: [*xs, NEXT, *xs]),
              *COPY_LENGTHS),
    PaperTask("mc", "reverse a string (reverse variant 1)", _sequence("Reverse:", lambda xs: xs[::-1]),
              *COPY_LENGTHS),
    PaperTask("mc2x", "reverse a string twice (reverse variant 1, 2x)",
              _sequence("Reverse:", lambda xs: [*xs[::-1], NEXT, *xs[::-1]]), *COPY_LENGTHS),
    PaperTask("mcrv", "reverse, then copy (reverse variant 2)",
              _sequence("Reverse:", lambda xs: [*xs[::-1], NEXT, *xs]), *COPY_LENGTHS),
    PaperTask("addition", "add two numbers, digit by digit", _addition, *_tr8(1)),
    PaperTask("sum", "sum of digits 1-9, mod 10", _sum, *_tr8(2)),
    PaperTask("parity", "is the number of ones even", _parity, *_tr8(3)),
    PaperTask("sort_single", "sort 50 single-token symbols", _sort_single, *_tr8(2)),
    PaperTask("sort_multi", "sort integers of 2-4 digits", _sort_multi, *_tr8(2)),
    PaperTask("poly", "a polynomial's value at x, mod 10", _poly, *_tr8(1)),
    PaperTask("lego", "follow a chain of +/- assignments", _lego, *_tr8(4)),
)}

# every word any task writes: the study's word-level vocabulary
WORDS: tuple[str, ...] = tuple(dict.fromkeys([
    *SYMBOLS, *LETTERS, *map(str, range(10)), NEXT, "Copy:", "Replace", "with", "in", "Reverse:", "Compute",
    "Compute:", "+", "-", "?", "Is", "even", "[", "]", "Yes", "No", "Sort", ",", "Evaluate", "x", "=", "*", "**",
    "If", "+1", "-1", SEPARATOR, END]))


def task_of(name: str) -> PaperTask:
    if name not in PAPER_TASKS:
        raise PosEncError(f"unknown task split {name!r}; the paper's splits here are {', '.join(PAPER_TASKS)}")
    return PAPER_TASKS[name]


def example(task: PaperTask, rng: random.Random, n: int) -> Example:
    prompt, answer = task.make(rng, n)
    return Example(" ".join([*prompt, SEPARATOR]), " " + " ".join([*answer, END]), n)


def _draw(task: PaperTask, rng: random.Random, lengths: Sequence[int], per_length: int,
          exclude: frozenset[str]) -> list[Example]:
    """`per_length` examples at each length, none of whose prompts is in `exclude`; distinct ones where 20 tries
    in a row find a new prompt (a length with few distinct instances repeats its examples rather than loop)."""
    out: list[Example] = []
    for n in lengths:
        seen: set[str] = set()
        made = 0
        misses = 0
        excluded = 0
        while made < per_length:
            e = example(task, rng, n)
            if e.prompt in exclude:
                excluded += 1
                if excluded > 100 * EXHAUSTED:
                    raise PosEncError(f"{task.name}: every prompt of length {n} drawn is excluded (held out)")
                continue
            excluded = 0
            if e.prompt in seen and misses < 20:
                misses += 1
                continue
            misses = 0
            seen.add(e.prompt)
            out.append(e)
            made += 1
    return out


EXHAUSTED = 20  # draws in a row that find no new prompt: a length's prompts are taken to be all found


def _held_out(task: PaperTask, rng: random.Random, lengths: Sequence[int], per_length: int) -> list[Example]:
    """`per_length` distinct held-out examples at each train length; a length with fewer distinct prompts than that
    (parity of 3 bits has 8) holds out half of those found, so training keeps the other half: holding out every one
    left training nothing to draw at that length (the draw looped forever)."""
    out: list[Example] = []
    for n in lengths:
        found: dict[str, Example] = {}
        misses = 0
        while len(found) < per_length and misses < EXHAUSTED:
            e = example(task, rng, n)
            if e.prompt in found:
                misses += 1
                continue
            misses = 0
            found[e.prompt] = e
        kept = list(found.values())
        out += kept if len(kept) == per_length else kept[:len(kept) // 2]
    return out


def split(name: str, *, train: int, iid: int, test: int, seed: int,
          lengths: tuple[Sequence[int], Sequence[int]] | None = None) -> dict[str, list[Example]]:
    """A run's three splits: `iid` held-out examples per train length and `test` per test length, drawn first,
    then `train` examples spread evenly over the train lengths, none of them a held-out prompt.
    `lengths`: (train, test) other than the paper's (the smoke study's)."""
    task = task_of(name)
    train_lengths, test_lengths = lengths or (task.train_lengths, task.test_lengths)
    rng = random.Random(f"paper-{name}-{seed}")
    held = _held_out(task, rng, train_lengths, iid)
    ood = _draw(task, rng, test_lengths, test, frozenset())
    per = -(-train // len(train_lengths))
    made = _draw(task, rng, train_lengths, per, frozenset(e.prompt for e in held))[:train]
    return {"train": made, "iid": held, "ood": ood}


def counts(examples: Sequence[Example]) -> dict[int, int]:
    """Examples per length (the study's records)."""
    return dict(sorted(collections.Counter(e.length for e in examples).items()))
