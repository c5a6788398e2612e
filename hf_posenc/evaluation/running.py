"""`run_suites`: the registered suites a `SuiteSettings` names, on an in-memory model, written to results.json as
each cell finishes."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .. import plots, results
from ..errors import PosEncError
from ..loading import inference_device_map, load
from ..patching import describe, unpatch
from ..progress import for_row, logged, waiting
from ..seq2seq import is_seq2seq
from . import sections
from .processes import rank_and_world
from .scoring import check_lengths
from .suite import (Scoring, SuiteSettings, check_model_kind, check_one_process, check_settings, parse_suites,
                    suite_of)

Planned = list[tuple[Any, Any, str]]  # (suite, its settings, its argument) in the order asked


def _checked(model: PreTrainedModel, settings: SuiteSettings) -> tuple[SuiteSettings, Planned]:
    """The settings with suites and lengths resolved, and each suite with its own settings checked and
    resolved: refused before anything runs."""
    suites = parse_suites(settings.suites)
    check_model_kind(suites, is_seq2seq(model), type(model).__name__)
    if settings.distributed:
        check_one_process(suites, "run it without distributed")
    lengths = check_lengths(settings.lengths)
    planned = []
    for name in suites:
        suite, argument = suite_of(name)
        own = settings.of(suite)
        check_settings(suite, own, lengths)
        planned.append((suite, suite.resolve(own, lengths), argument))
    return settings.replace(suites=suites, lengths=lengths), planned


def run_suites(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: SuiteSettings,
               out: str | Path) -> results.Results:
    """Run suites on an in-memory model; `out/results.json` is rewritten after every cell, so what
    finished survives a crash, and the plots are drawn at the end.

    Args:
        settings: what to score and how (see `SuiteSettings`).
        out: the folder of results.json and the plots.
    """
    s, planned = _checked(model, settings)
    out = Path(out)
    rank, world = rank_and_world(s.distributed)
    main = rank == 0
    if main:
        out.mkdir(parents=True, exist_ok=True)
    name = s.name or type(model).__name__
    run = results.Run(results.run_label(name, s.scheme, s.options), s.scheme, dict(s.options),
                      getattr(model.config, "posenc", None) if describe(model) else None)
    shared = {"lengths": s.lengths, "batch_size": s.batch_size, "seed": s.seed,
              "dtype": s.dtype or str(model.dtype).removeprefix("torch.")}
    record = results.Results("eval", name, runs=[run], settings={"suite": s.suites, **shared},
                             details={"processes": world})
    for suite, own, argument in planned:
        record.suites[suite.name] = sections.section(suite, {**shared, **suite.recorded(own, argument)})
    path = out / "results.json"

    def save(complete: bool = False) -> None:
        if main:
            record.save(path, complete=complete)

    save()
    scoring = Scoring(model, tokenizer, s.lengths, s.batch_size, s.seed, s.distributed, progress=main)
    _measured(scoring, planned, record, run, save)
    original = _load_original(scoring, s) if s.original else None
    if s.baseline and describe(model) is not None:
        native = (getattr(model.config, "posenc", None) or {}).get("from") or "native"
        unpatch(model)
        # patched here: unpatched is the original model; loaded patched (a trained folder): its own weights
        label = results.baseline_label(name, s.scheme, native)
        if original is not None and same_weights(model, original[0]):  # a patched, untrained folder: scored once
            label, original = results.same_rows(label, results.original_label(s.original)), None
        _measured(scoring, planned, record, results.Run(label), save)
    if original is not None:
        _measured(dataclasses.replace(scoring, model=original[0], tokenizer=original[1]), planned, record,
                  results.Run(results.original_label(s.original)), save)
        del original
    save(complete=True)
    if main:
        plots.results_by_length(record.runs, record.tables(), out)
    return record


def _measured(scoring: Scoring, planned: Planned, record: results.Results, run: results.Run,
              save: Callable[[], None]) -> None:
    """Score one run (appended to the record if new) and record its peak memory."""
    if not any(known is run for known in record.runs):
        record.runs.append(run)
    reset_peak_memory(scoring.model.device)
    _score(scoring, planned, record, run, save)
    record.details.setdefault("peak_memory_mb", {})[run.label] = peak_memory_mb(scoring.model.device)


def _load_original(scoring: Scoring, s: SuiteSettings) -> tuple[PreTrainedModel, PreTrainedTokenizerBase] | None:
    """The model a trained or patched folder came from, loaded to be scored with the same settings: the baseline
    a reader means by "original" (the folder's own weights with RoPE put back scored 16.09, the original 14.32).
    A model that cannot be loaded is said in one line and left out; the rows already scored stand."""
    model = scoring.model
    with waiting(f"loading the original model {s.original}", show=scoring.progress):
        try:
            return load(s.original, task="seq2seq" if is_seq2seq(model) else "causal_lm", dtype=model.dtype,
                        device_map=inference_device_map(model.device if s.distributed else None))
        except PosEncError as err:
            print(f"eval: the original model {s.original} is not scored: {err}", file=sys.stderr, flush=True)
            return None


def same_weights(model: PreTrainedModel, other: PreTrainedModel) -> bool:
    """Whether two models hold the same tensors under the same names: an untrained patched folder, unpatched, is
    its original model, and scoring it twice costs a third of an eval for two identical rows."""
    ours, theirs = model.state_dict(), other.state_dict()
    return ours.keys() == theirs.keys() and all(
        ours[k].shape == theirs[k].shape and torch.equal(ours[k], theirs[k].to(ours[k].device)) for k in ours)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process's run: the CUDA allocator's peak since `reset_peak_memory`, else the
    resident set's high-water mark since the process started (the OS keeps no resettable one)."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


def _score(scoring: Scoring, planned: Planned, record: results.Results, run: results.Run,
           save: Callable[[], None]) -> None:
    """One run's suites, in the order asked, saving the record after every cell; bars named by the run, and
    one line a cell where bars do not show."""
    t0 = time.perf_counter()
    with for_row(run.label):
        for suite, own, argument in planned:
            section = record.suites[suite.name]
            for table, key, cell in suite.cells(scoring, own, argument):
                if table not in section.tables:
                    raise PosEncError(f"suite {suite.name!r} wrote the table {table!r}, which its `metrics` do not "
                                      f"declare (it declares {', '.join(section.tables) or 'none'})")
                run.put(table, key, cell)
                sections.wrote(section, suite, table, key)
                save()
                if scoring.progress:
                    logged(f"eval: {run.label}: {results.cell_text(table, section.tables[table], key, cell)} "
                           f"({time.perf_counter() - t0:.0f} s)")
