"""Exact match by length, with n and the 95% Wilson interval of each rate: from predictions (any source), or from
a causal LM's greedy answers (`evaluation.scoring.greedy_answers`: one teacher-forced pass per prompt, the same
exact match as `generate(do_sample=False)`)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from ...stats import rate_fields
from ..scoring import greedy_answers, load_metric
from .tasks import Example

Cell = dict[str, Any]  # {"exact_match", "n", "low", "high"}


def by_length(predictions: Sequence[str], references: Sequence[str], lengths: Sequence[int]) -> dict[int, Cell]:
    """length -> exact match over that length's examples (surrounding whitespace ignored, as the
    `length_generalization` metric compares), with n and its 95% interval."""
    scored = load_metric("length_generalization").compute(predictions=list(predictions),
                                                          references=list(references), lengths=list(lengths))
    counts = collections.Counter(lengths)
    return {n: {"exact_match": rate, **rate_fields(round(rate * counts[n]), counts[n])}
            for n, rate in scored["by_length"].items()}


def pooled(cells: dict[int, Cell]) -> Cell:
    """One rate over every length's examples (the in-distribution gate reads it), with n and its interval."""
    hits = sum(round(c["exact_match"] * c["n"]) for c in cells.values())
    n = sum(c["n"] for c in cells.values())
    return {"exact_match": hits / n, **rate_fields(hits, n)}


def shots_prefix(shots: Sequence[Example]) -> str:
    """Worked examples put before each prompt, one a line: how a model not trained on the task is asked in-context."""
    return "".join(f"{e.prompt}{e.target}\n" for e in shots)


def score(model: Any, tokenizer: Any, examples: Sequence[Example], *, prefix: str = "", batch_size: int = 8,
          progress: bool = False, distributed: bool = False) -> dict[int, Cell]:
    """A causal LM's exact match by length on `examples` (greedy answers after `prefix` + each prompt)."""
    predictions = greedy_answers(model, tokenizer, [prefix + e.prompt for e in examples], [e.target for e in examples],
                                 batch_size=batch_size, desc="length generalisation", progress=progress,
                                 distributed=distributed)
    return by_length(predictions, [e.target for e in examples], [e.length for e in examples])
