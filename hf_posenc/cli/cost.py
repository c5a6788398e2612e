"""The cost of an evaluation, estimated before it starts: a length far beyond the rest is announced.

`--lengths 128,99999` (a typo for 9999: 12x SmolLM2's trained range) once ran 11 minutes in silence before it
was interrupted. A forward pass over L tokens costs about 2 N L (the weights, N parameters) + 2 n d L^2
(attention scores and their weighted sum over the causal half, n layers of width d) floating-point operations
(Kaplan et al. 2020, table 1); each length scores a number of sequences the flags fix. A length past the model's
trained range, or one costing far more than all the others together, gets one line on stderr before the model
loads: the estimate, and how to stop.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any


# fp32 matmul rate of 2 CPU cores, for the time estimate: 13 GFLOP/s measured (1024^2 matmuls, 2 threads) on the
# project's 2-core machine at load average 5.7; idle cores give a few times more, a GPU hundreds of times
CPU_FLOPS = 2e10
DOMINATES = 10.0  # a length costing this many times all the others together is announced


def model_size(config: Any) -> tuple[float, int, int]:
    """(parameters, layers, width) of a transformers config, approximately (the weights of its blocks and the
    embedding)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0) or 1)
    width = int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0) or 1)
    ffn = int(getattr(text, "intermediate_size", 0) or 4 * width)
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    return layers * (4 * width * width + 3 * width * ffn) + vocab * width, layers, width


def sequences_per_length(args: argparse.Namespace, config: Any) -> int:
    """The sequences each length scores, as each suite counts them (`Suite.sequences`: perplexity windows,
    passkey prompts, RULER prompts), from the checked flag values (`args.values`), once for each model run: the
    model, its baseline (patched here, or loaded patched) and the original it came from (`args.original`)."""
    from ..evaluation.suite import suite_of

    count = 0
    for name in args.suites:
        suite, argument = suite_of(name)
        own = suite.Settings(**{f.name: args.values[f.name] for f in dataclasses.fields(suite.Settings)}) \
            if suite.Settings else None
        count += suite.sequences(own, argument)
    patched = args.scheme is not None or getattr(config, "posenc", None) is not None
    return count * (1 + (not args.no_baseline and patched) + (getattr(args, "original", None) is not None))


def announcement(args: argparse.Namespace, config: Any) -> str | None:
    """The line announcing an evaluation whose longest length is past the trained range or costs more than
    `DOMINATES` times the other lengths together; None for any other."""
    sequences = sequences_per_length(args, config)
    if not sequences:
        return None
    params, layers, width = model_size(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    trained = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)

    def flops(length: int) -> float:
        return 2 * params * length + 2 * layers * width * length * length

    longest = max(args.lengths)
    rest = sum(flops(length) for length in args.lengths if length != longest)
    past = trained is not None and longest > trained
    if not past and not (rest and flops(longest) > DOMINATES * rest):
        return None
    reasons = []
    if past:
        reasons.append(f"{longest / trained:.1f}x the model's trained range ({trained} positions)")
    if rest:
        quadratic = " (attention grows with the square of the length)" if layers * width * longest > params else ""
        reasons.append(f"~{flops(longest) / rest:,.0f}x the compute of the other lengths together{quadratic}")
    total = sequences * sum(flops(length) for length in args.lengths)
    hours = total / CPU_FLOPS / 3600
    return (f"eval: --lengths {longest} is {' and '.join(reasons)}: ~{total:.1e} floating-point operations over "
            f"{sequences} sequences per length, about {hours:,.1f} h on 2 CPU cores at {CPU_FLOPS / 1e9:.0f} GFLOP/s "
            f"(a GPU is far faster). Ctrl-C stops it; a rerun with the same --out replaces what it leaves.")


def announce(args: argparse.Namespace, config: Any) -> None:
    """Print `announcement` to stderr, if any (once: not again in each process `--accelerate-config` starts)."""
    line = announcement(args, config) if "WORLD_SIZE" not in os.environ else None
    if line is not None:
        print(line, file=sys.stderr, flush=True)
