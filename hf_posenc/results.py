"""The one results file, `results.json`: typed, versioned, written by `eval`, `train` and `demo` alike.

A file holds one or more runs -- an evaluation has one; a training run has the original model, the
swapped model before training and after; the demo one per scheme. Every run keeps its numbers in
metric tables, keyed the same way wherever they come from. Which tables there are, and how each reads
(its headline fields, what its keys count, which field is a rate, its model-index task and dataset, its
plot), is not written here: each evaluation suite declares the tables it writes (`Metric`, registered
with the suite; `hf-posenc eval --help` and docs/guide/eval.md list them), and `METRICS` here is their table.
A table no registered suite declares (a plug-in not imported now) still prints: `metric` reads its
numeric fields off the cells.

Every rate (passkey accuracy, exact match, classification accuracy, RULER score) carries its trial
count `n` and 95% Wilson interval `low`, `high` (`hf_posenc.stats`) in the same cell; tables print
them as `0.83 [0.55, 0.95] (n=12)`. Format 3 added them (and the RULER tables) to format 2, which is
still read: its rates print without an interval.

A cell that could not be measured is {"skipped": reason}. Files are replaced atomically, so a crash
leaves the last complete version, and `load` refuses any other format with a message naming it.

Perplexity cells say how they were measured (`mode`, see `evaluation.PERPLEXITY_MODES`; eval and demo
also record `perplexity_mode` and `target_tokens` in their settings). Format-2 files written before
modes existed have neither and were measured on the first L tokens; `compare` flags or refuses mixing them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from .errors import PosEncError
from .stats import intervals_overlap

__all__ = ["FORMAT", "METRICS", "READS", "RULER_TASKS", "Metric", "Plot", "Results", "Run", "field_name",
           "format_rate", "interval", "interval_notes", "key_order", "load", "markdown", "metric", "run_label", "tables",
           "versions", "write_json"]

FORMAT = 3
READS = (2, 3)  # format 2 is format 3 without n/low/high and RULER tables
# RULER's synthetic tasks (Hsieh et al. 2024) as lm-eval 0.4.13 ships them; one metric table each.
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
Kind = Literal["eval", "train", "demo"]
KINDS: tuple[str, ...] = Kind.__args__


@dataclasses.dataclass(frozen=True)
class Plot:
    """A figure of one or more metric tables (every table with an equal `Plot` goes into one file).

    `kind` names one of `hf_posenc.plots.DRAWERS` ("lines", "depth_heatmap", "heatmap"), so a suite's module
    imports no plotting library; a callable `(runs, tables, path) -> path` draws its own figure instead.
    """

    file: str
    kind: str | Callable[..., Any] = "lines"
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    field: str = ""  # the cell field drawn (default: the table's first headline field)
    log_x: bool = False
    log_y: bool = False


@dataclasses.dataclass(frozen=True)
class Metric:
    """How a metric table reads: the headline fields of a cell, what its keys count, which field is a rate
    whose n and Wilson interval the cell carries; its model-index task (type, name) and dataset (a function of
    the cell's key and the eval settings -> `EvalResult` dataset fields), and its plot."""

    fields: tuple[str, ...]
    key: str
    rate: str | None = None
    task: tuple[str, str] = ("text-generation", "")
    dataset: Callable[[str, Mapping[str, Any]], dict[str, Any]] | None = None
    plot: Plot | None = None


# results.json metric table -> how it reads, written by suites (`evaluation.suite.register_suite`) and training tasks
METRICS: dict[str, Metric] = {}


def register_metric(name: str, metric: Metric) -> Metric:
    """A results.json metric table that is not (only) a suite's, e.g. what a training task writes; the
    same table registered twice must read the same."""
    if METRICS.get(name, metric) != metric:
        raise ValueError(f"metric table {name!r} is already registered as {METRICS[name]}")
    METRICS.setdefault(name, metric)
    return metric


def metric(name: str, cells: Mapping[str, Mapping[str, Any]] | None = None) -> Metric:
    """The registered `Metric` of a table, else one read off its cells: every numeric field, keys without a
    unit, the first field as the rate when the cells carry a Wilson interval (n, low, high)."""
    if name in METRICS:
        return METRICS[name]
    fields = dict.fromkeys(f for cell in (cells or {}).values() for f, v in cell.items()
                           if isinstance(v, (int, float)) and f not in ("n", "low", "high"))
    rated = any("low" in cell for cell in (cells or {}).values())
    return Metric(tuple(fields), "", next(iter(fields), None) if rated else None, task=("other", name))


def key_order(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if key.isdigit() else (1, key)


@dataclasses.dataclass
class Run:
    """One model scored: what it was (label, scheme, options, `describe(model)`) and its metric tables."""

    label: str
    scheme: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    posenc: dict[str, Any] | None = None
    metrics: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    seconds: float | None = None

    def put(self, metric: str, key: int | str, cell: dict[str, Any]) -> None:
        if metric not in METRICS:
            raise PosEncError(f"unknown metric table {metric!r}; results hold {', '.join(METRICS)}")
        self.metrics.setdefault(metric, {})[str(key)] = cell

    def cells(self, metric: str) -> list[tuple[str, dict[str, Any]]]:
        """(key, cell) pairs of one table, numeric keys in numeric order."""
        table = self.metrics.get(metric, {})
        return [(key, table[key]) for key in sorted(table, key=key_order)]


@dataclasses.dataclass
class Results:
    """Everything one command measured; `save` it as it grows, `load` it back."""

    kind: Kind
    model: str
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    runs: list[Run] = dataclasses.field(default_factory=list)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)  # kind-specific facts (train: steps, ranks)
    versions: dict[str, str] = dataclasses.field(default_factory=lambda: versions())
    started: str = dataclasses.field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    wall_time_s: float = 0.0
    complete: bool = False
    format: int = FORMAT

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PosEncError(f"results kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        self._clock = time.perf_counter() - self.wall_time_s

    def run(self, label: str) -> Run:
        for run in self.runs:
            if run.label == label:
                return run
        raise PosEncError(f"no run {label!r} in these results; runs: {', '.join(r.label for r in self.runs)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | os.PathLike, *, complete: bool = False) -> Path:
        self.wall_time_s = round(time.perf_counter() - self._clock, 2)
        self.complete = complete
        return write_json(path, self.to_dict())


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write JSON through a temporary file and a rename: readers see the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
    return path


def _format_name(data: dict[str, Any]) -> str:
    fmt = data.get("format")
    if fmt is None:
        return "results without a format field (hf-posenc 0.1 `train` or `demo`)"
    if isinstance(fmt, int) and fmt > FORMAT:
        return f"results format {fmt}, from a newer hf-posenc"
    return f"results format {fmt!r}" + (" (hf-posenc 0.1 `eval`)" if fmt == 1 else "")


def load(path: str | os.PathLike) -> Results:
    """Read a results.json written by `eval`, `train` or `demo`; any other format is a PosEncError naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        reason = "not a JSON text file" if isinstance(err, (UnicodeDecodeError, json.JSONDecodeError)) else err
        raise PosEncError(f"cannot read results file {path}: {reason}; give a results.json written by hf-posenc "
                          f"eval, train or demo") from err
    if not isinstance(data, dict):
        raise PosEncError(f"{path} is not a results file: it holds a JSON {type(data).__name__}, not an object")
    if data.get("format") not in READS:
        raise PosEncError(f"{path} holds {_format_name(data)}; this hf-posenc reads results formats "
                          f"{', '.join(map(str, READS))}: rerun the command that wrote it")
    try:
        runs = [Run(**run) for run in data.pop("runs")]
        return Results(**data, runs=runs)
    except (KeyError, TypeError) as err:
        raise PosEncError(f"{path} is not a valid format-{data['format']} results file ({err})") from err


def run_label(model: str, scheme: str | None, options: dict[str, Any]) -> str:
    """'<model> <scheme>(<options>)' ('<model> <scheme>' without options: a column headed `smollm2 alibi()` read
    as a call), or '<model> (as loaded)' when nothing was patched."""
    name = Path(model).name or model
    opts = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
    return (f"{name} {scheme}({opts})" if opts else f"{name} {scheme}") if scheme else f"{name} (as loaded)"


def baseline_label(model: str, scheme: str | None, native: str) -> str:
    """The row of a patched model's baseline: the model unpatched (patched here by `scheme`), or a patched
    folder's own weights with its `native` positions put back."""
    name = Path(model).name or model
    return f"{name} (unpatched)" if scheme else f"{name} (its own weights, {native} positions)"


def original_label(original: str) -> str:
    """The row of the model a trained or patched folder came from."""
    return f"{Path(original).name or original} (original model)"


def same_rows(first: str, second: str) -> str:
    """One row standing for two that are the same weights, scored once: 'p1 (its own weights, ...) = smollm2
    (original model)'."""
    return f"{first} = {second}"


def versions() -> dict[str, str]:
    """Installed versions of what a result depends on."""
    found = {"python": platform.python_version()}
    for name in ["hf-posenc", "torch", "transformers", "accelerate", "peft", "datasets", "evaluate"]:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def field_name(metric: str, field: str) -> str:
    """How a number is called in tables and cards: 'perplexity', 'passkey accuracy', 'copy exact match'."""
    return metric if field == metric else f"{metric} {field.replace('_', ' ')}"


def _value(cell: dict[str, Any], field: str, rate: str | None = None) -> str:
    if field not in cell:
        return f"skipped ({str(cell.get('skipped', '?'))[:60]})"
    if field == rate and "n" in cell:
        return format_rate(cell[field], cell["n"], cell["low"], cell["high"])
    return f"{cell[field]:.4g}"


def format_rate(value: float, n: int, low: float, high: float) -> str:
    """A rate as tables print it: '0.83 [0.55, 0.95] (n=12)'."""
    return f"{value:.2f} [{low:.2f}, {high:.2f}] (n={n})"


def interval(cell: dict[str, Any], metric: str | Metric) -> tuple[float, float] | None:
    """The 95% interval of a cell's rate, or None (not a rate, skipped, or a format-2 cell)."""
    rate = (METRICS[metric] if isinstance(metric, str) else metric).rate
    return (cell["low"], cell["high"]) if rate in cell and "low" in cell else None


def tables(runs: list[Run]) -> list[tuple[str, Metric]]:
    """The metric tables the runs hold, registered ones in the registry's order, then any others."""
    held = {name: cells for run in runs for name, cells in run.metrics.items()}
    return [(name, metric(name, held[name])) for name in sorted(held, key=[*METRICS, *held].index)]


def cell_text(table: str, key: int | str, cell: dict[str, Any]) -> str:
    """One finished cell in a line, as a progress log prints it: 'perplexity @ 2048 tokens: 11.38'."""
    spec = metric(table, {str(key): cell})
    unit = f" {spec.key}" if str(key).isdigit() and spec.key else ""
    values = ", ".join(f"{field_name(table, f)} {_value(cell, f, spec.rate)}" for f in spec.fields) or "done"
    return f"{table} @ {key}{unit}: {values}"


def markdown(runs: list[Run]) -> str:
    """One Markdown row per run, table, key and headline field: | run | metric | value |."""
    lines = ["| run | metric | value |", "|---|---|---|"]
    held = tables(runs)
    for run in runs:
        for metric, spec in held:
            for key, cell in run.cells(metric):
                unit = f" {spec.key}" if key.isdigit() and spec.key else ""
                for field in spec.fields:
                    lines.append(f"| {run.label} | {field_name(metric, field)} @ {key}{unit} | "
                                 f"{_value(cell, field, spec.rate)} |")
    return "\n".join(lines)


def scored_places(settings: dict[str, Any]) -> str:
    """What a perplexity table scored, said beside it: in same_target mode the windows' end places and the number
    of target tokens follow from the whole set of lengths (the longest sets the room left before the first end,
    the shortest the default target), so the same model at the same length scores differently in a run with
    another set of lengths (7.54 in one eval, 10.90 in the demo)."""
    mode, lengths = settings.get("perplexity_mode", "same_target"), settings.get("lengths") or []
    where = f"{settings.get('max_windows')} windows of {settings.get('text', 'the text')}"
    if mode == "same_target":
        return (f"perplexity scored the same last {settings.get('target_tokens')} tokens of {where} at every length; "
                f"where those windows end depends on the set of lengths ({', '.join(map(str, lengths))}): compare "
                "only runs with the same lengths, text, windows and targets (eval --compare checks it)")
    return (f"perplexity scored sliding windows from the start of {settings.get('text', 'the text')} (each length "
            f"other tokens; stride {settings.get('stride') or 'the length'}, at most {settings.get('max_windows')} "
            "windows)")


def interval_notes(runs: list[Run]) -> list[str]:
    """For every table cell two or more runs measured as a rate, whether each pair's 95% intervals
    overlap (the runs are not shown to differ) or are apart (they differ at that level)."""
    notes = []
    for metric, spec in tables(runs):
        keys = sorted({key for run in runs for key, _ in run.cells(metric)}, key=key_order)
        for key in keys:
            measured = [(run.label, cell) for run in runs if (cell := run.metrics.get(metric, {}).get(key))
                        and interval(cell, spec)]
            for i, (a, ca) in enumerate(measured):
                for b, cb in measured[i + 1:]:
                    overlap = intervals_overlap(interval(ca, spec), interval(cb, spec))
                    unit = f" {spec.key}" if key.isdigit() and spec.key else ""
                    verdict = ("intervals overlap: not shown to differ" if overlap
                               else "intervals apart: they differ (95%)")
                    notes.append(f"{field_name(metric, spec.rate)} @ {key}{unit}: {a} "
                                 f"{format_rate(ca[spec.rate], ca['n'], ca['low'], ca['high'])} vs {b} "
                                 f"{format_rate(cb[spec.rate], cb['n'], cb['low'], cb['high'])}: {verdict}")
    return notes
