"""An evaluation's plan, said before the model loads: its rows, suites and cells, and a time estimate.

A new user's 13-minute eval said nothing up front: not that a third of it would score the same weights a second
time, nor how long it would take; and `--lengths 128,99999` (a typo for 9999: 12x SmolLM2's trained range) once ran
11 minutes in silence. A forward pass over L tokens costs about 2 N L (the weights, N parameters) + 2 n d L^2
(attention scores and their weighted sum over the causal half, n layers of width d) floating-point operations
(Kaplan et al. 2020, table 1); each suite says how many sequences of how many tokens each of its cells scores
(`Suite.cell_sizes`). A sequence past the model's trained range, or a length costing far more than all the others
together, gets a warning line too, naming the suites that read it (a suite that never reads `--lengths` is not
warned about them).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from .. import results

# fp32 matmul rate of 2 CPU cores, for the time estimate: 13 GFLOP/s measured (1024^2 matmuls, 2 threads) on the
# project's 2-core machine at load average 5.7; idle cores give a few times more, a GPU hundreds of times
CPU_FLOPS = 2e10
DOMINATES = 10.0  # a length costing this many times all the others together is announced


@dataclasses.dataclass(frozen=True)
class Cells:
    """One suite's cells for one row: (sequences, tokens in each) per cell; empty when it cannot tell."""

    suite: str
    sizes: list[tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What an eval will score: its rows (models) and, for each row, every suite's cells."""

    rows: list[str]
    suites: list[Cells]


def model_size(config: Any) -> tuple[float, int, int]:
    """(parameters, layers, width) of a transformers config, approximately (the weights of its blocks and the
    embedding)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0) or 1)
    width = int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0) or 1)
    ffn = int(getattr(text, "intermediate_size", 0) or 4 * width)
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    return layers * (4 * width * width + 3 * width * ffn) + vocab * width, layers, width


def rows(args: argparse.Namespace, config: Any) -> list[str]:
    """The runs `run_suites` will score, labelled as it labels them: the model, its baseline when it is patched
    (here, or a patched folder), the original it came from; an untrained patched folder's baseline is its
    original (`args.same_as_original`), one row with both names."""
    posenc = getattr(config, "posenc", None)
    labels = [results.run_label(args.model, args.scheme, args.options)]
    original = results.original_label(args.original) if args.original else None
    if not args.no_baseline and (args.scheme is not None or posenc is not None):
        baseline = results.baseline_label(args.model, args.scheme, (posenc or {}).get("from") or "native")
        if original is not None and args.same_as_original:
            baseline, original = results.same_rows(baseline, original), None
        labels.append(baseline)
    return labels + ([original] if original else [])


def plan(args: argparse.Namespace, config: Any) -> Plan:
    """The checked flags' plan (`args.values`: every suite setting)."""
    from ..evaluation.suite import group_of, suite_of

    suites = []
    for name in args.suites:
        suite, argument = suite_of(name)
        own = suite.Settings(**args.values[group_of(suite)]) if suite.Settings else None
        suites.append(Cells(name, suite.cell_sizes(own, argument, args.lengths)))
    return Plan(rows(args, config), suites)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 \
        else f"{seconds / 3600:.1f} h"


def announcement(args: argparse.Namespace, config: Any) -> str:
    """The plan in a few lines: rows, each suite's cells and lengths, the estimate; then a warning where a length
    is past the trained range or costs more than `DOMINATES` times the other lengths together."""
    p = plan(args, config)
    params, layers, width = model_size(config)

    def flops(tokens: int) -> float:
        return 2 * params * tokens + 2 * layers * width * tokens * tokens

    parts = []
    for cells in p.suites:
        lengths = ", ".join(str(t) for t in dict.fromkeys(t for _, t in cells.sizes))
        parts.append(f"{cells.suite}: {len(cells.sizes)} cells at ~{lengths} tokens" if cells.sizes
                     else f"{cells.suite}: cells and time not estimated")
    total = len(p.rows) * sum(n * flops(t) for cells in p.suites for n, t in cells.sizes)
    n_cells = sum(len(cells.sizes) for cells in p.suites)
    estimate = (f"about {_duration(total / CPU_FLOPS)} on 2 CPU cores (~{total:.1e} floating-point operations at "
                f"{CPU_FLOPS / 1e9:.0f} GFLOP/s; a GPU is far faster)") if total else "time not estimated"
    lines = [f"eval: {len(p.rows)} row(s) x {n_cells} cell(s) ({'; '.join(parts)}), {estimate}:",
             *(f"  {label}" for label in p.rows)]
    if (warning := _warning(p, config, flops)) is not None:
        lines.append(warning)
    return "\n".join(lines)


def _warning(p: Plan, config: Any, flops: Callable[[int], float]) -> str | None:
    """One line where the longest sequences are past the trained range or dominate the cost; None otherwise."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    trained = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    by_length: dict[int, float] = {}
    for cells in p.suites:
        for n, tokens in cells.sizes:
            by_length[tokens] = by_length.get(tokens, 0.0) + n * flops(tokens)
    if not by_length:
        return None
    longest = max(by_length)
    rest = sum(cost for tokens, cost in by_length.items() if tokens != longest)
    past = trained is not None and longest > trained
    if not past and not (rest and by_length[longest] > DOMINATES * rest):
        return None
    reasons = []
    if past:
        reasons.append(f"{longest / trained:.1f}x the model's trained range ({trained} positions)")
    if rest:
        params, layers, width = model_size(config)
        quadratic = " (attention grows with the square of the length)" if layers * width * longest > params else ""
        reasons.append(f"~{by_length[longest] / rest:,.0f}x the compute of the other lengths together{quadratic}")
    readers = ", ".join(c.suite for c in p.suites if any(t == longest for _, t in c.sizes))
    return (f"eval: {longest} tokens ({readers}) is {' and '.join(reasons)}. Ctrl-C stops it; a rerun with the "
            f"same --out replaces what it leaves.")


def announce(args: argparse.Namespace, config: Any) -> None:
    """Print `announcement` to stderr (once: not again in each process `--accelerate-config` starts)."""
    if "WORLD_SIZE" not in os.environ:
        print(announcement(args, config), file=sys.stderr, flush=True)
