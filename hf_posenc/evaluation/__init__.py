"""Score (patched) models in memory: perplexity by length, passkey retrieval, length generalisation
and sentiment classification, and the suites `hf-posenc eval` runs (registered plug-ins, one module each).

Everything runs on the model object itself, so a model patched with `hf_posenc.patch` is scored as
patched (evaluate's own perplexity metric reloads a model by id and cannot do that). Scores are
aggregated by the evaluate modules in `hf_posenc/metrics/`; suites write `hf_posenc.results`.

    scoring       running a model for scores (hidden states, fp32 logits, greedy answers, length limits)
    long_context  perplexity by length (same targets at every length, or sliding windows), prefix
                  perplexity, passkey retrieval
    tasks         length generalisation (causal LMs; encoder-decoders on input -> output pairs), sentiment
    ruler         RULER's synthetic tasks through lm-eval's generators and scorer, offline
    names         RULER task and perplexity mode names, checked without torch
    suite         the `Suite` contract, `SuiteSettings`, parsing and checking suite names (torch-free)
    suites/       the built-in suites, one module each, registered when this package is imported
    running       `run_suites`: the suites named, results.json as they run
    comparing     `compare` and what a results file's numbers depend on
    sections      a suite's section of results.json: its settings, versions, notes and tables' schemas as data
    older         `load_results`: results files of any format read, formats 2 and 3 given the built-in sections
    held_out      training's held-out tables, described as a suite's (train writes the cells)
    processes     the same scores split over the processes of a launch (distributed=True)

Importing this package registers the built-in suites (torch-free, so `hf-posenc eval --help` lists them at
once); the scoring submodules load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

from . import suites  # noqa: F401  (import registers the built-in suites)

# public name -> the submodule that defines it
_EXPORTS = {name: module for module, names in {
    "long_context": ("PASSKEY_FILLER", "PASSKEY_QUESTION", "PASSKEY_TASK", "passkey", "passkey_prompt",
                     "perplexity_by_length", "prefix_perplexity", "target_ends"),
    "names": ("PERPLEXITY_MODES", "RULER_TASKS"),
    "scoring": ("LENGTH_LIMITS", "METRICS_DIR", "load_metric", "text_token_ids"),
    "ruler": ("ruler_scores",),
    "suite": ("Suite", "SuiteSettings", "parse_suites"),
    "running": ("run_suites",),
    "comparing": ("compare",),
    "older": ("load_results",),
    "tasks": ("SENTIMENT_PROMPT", "classification", "length_generalization", "seq2seq_length_generalization"),
}.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
