"""The one results file, `results.json`: typed, versioned, written by `eval`, `train` and `demo` alike.

A file holds one or more runs -- an evaluation has one; a training run has the original model, the
swapped model before training and after; the demo one per scheme. Every run keeps its numbers in
metric tables, keyed the same way wherever they come from.

A file describes itself (format 4): beside the numbers it holds one `Section` per suite that measured them -- its
settings, what measured it (the suite's name, version and packages), what its numbers depend on (`measured`, which
`compare` checks), notes a reader needs beside its tables, the Hub datasets it read, and each of its tables' schema
as data (`Table`: headline fields, what the keys count, the rate and its n and interval fields, `higher_is_better`,
the model-index task and dataset of each key, the plot). So a card, a comparison, a plot or a table of a file
written by a suite that is not installed now reads the same as one whose suite is (as lm-eval's results carry each
task's config and `higher_is_better`). Nothing here knows a suite: the suites (`hf_posenc.evaluation`) write the
sections. Formats 2 and 3 (numbers only) still load; `hf_posenc.evaluation.load_results` gives them the built-in
suites' schemas. A table no section describes still prints: `Table.read_off` reads its numeric fields off the cells.

Every rate (passkey accuracy, exact match, classification accuracy, RULER score) carries its trial
count `n` and 95% Wilson interval `low`, `high` (`hf_posenc.stats`) in the same cell; tables print
them as `0.83 [0.55, 0.95] (n=12)`. Format 3 added them to format 2, whose rates print without an interval.

A cell that could not be measured is {"skipped": reason}. Files are replaced atomically, so a crash
leaves the last complete version, and `load` refuses any other format with a message naming it.
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

__all__ = ["FORMAT", "READS", "Plot", "Results", "Run", "Section", "Table", "described", "field_name",
           "format_rate", "interval", "interval_notes", "key_order", "load", "markdown", "run_label", "versions",
           "write_json"]

FORMAT = 4
READS = (2, 3, 4)  # format 3 is format 4 without sections; format 2 is format 3 without n/low/high and RULER tables
N, INTERVAL = "n", ("low", "high")  # a rate's trial count and 95% Wilson interval, beside it in the cell
Kind = Literal["eval", "train", "demo"]
KINDS: tuple[str, ...] = Kind.__args__


@dataclasses.dataclass(frozen=True)
class Plot:
    """A figure of one or more metric tables (every table with an equal `Plot` goes into one file).

    `kind` names one of `hf_posenc.plots.DRAWERS` ("lines", "depth_heatmap", "heatmap"), so a suite's module
    imports no plotting library; a callable `(runs, tables, path) -> path` draws its own figure instead (the file
    records its name; read back without it, the figure is drawn as lines).
    """

    file: str
    kind: str | Callable[..., Any] = "lines"
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    field: str = ""  # the cell field drawn (default: the table's first headline field)
    log_x: bool = False
    log_y: bool = False

    def to_dict(self) -> dict[str, Any]:
        kind = self.kind if isinstance(self.kind, str) else f"{self.kind.__module__}.{self.kind.__qualname__}"
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "kind": kind}


@dataclasses.dataclass(frozen=True)
class Table:
    """How a metric table reads, as data: its headline fields, what its keys count (`unit`), which field is a rate
    (whose trial count `n` and 95% interval `interval` fields the cell carries), which fields are better higher,
    its model-index task (type, name), the model-index dataset of each key it holds, and its plot."""

    fields: tuple[str, ...]
    unit: str = ""
    rate: str | None = None
    higher_is_better: dict[str, bool] = dataclasses.field(default_factory=dict)
    n: str | None = None
    interval: tuple[str, str] | None = None
    task: tuple[str, str] = ("text-generation", "")
    datasets: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    plot: Plot | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "plot": self.plot.to_dict() if self.plot else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Table:
        plot, interval = data.get("plot"), data.get("interval")
        return cls(**{**data, "fields": tuple(data["fields"]), "task": tuple(data["task"]),
                      "interval": tuple(interval) if interval else None, "plot": Plot(**plot) if plot else None})

    @classmethod
    def read_off(cls, name: str, cells: Mapping[str, Mapping[str, Any]]) -> Table:
        """A table no section describes (a format-2/3 file of a suite not installed now): every numeric field,
        keys without a unit, the first field as the rate when the cells carry a Wilson interval."""
        fields = dict.fromkeys(f for cell in cells.values() for f, v in cell.items()
                               if isinstance(v, (int, float)) and f not in (N, *INTERVAL))
        rated = any(INTERVAL[0] in cell for cell in cells.values())
        rate = next(iter(fields), None) if rated else None
        return cls(tuple(fields), rate=rate, n=N if rate else None, interval=INTERVAL if rate else None,
                   task=("other", name))

    def dataset(self, name: str, key: str) -> dict[str, Any]:
        """The model-index dataset of one key; a table that names none is its own dataset."""
        return self.datasets.get(key) or {"dataset_type": name, "dataset_name": name}


@dataclasses.dataclass
class Section:
    """What one suite wrote into a file: who measured (`suite`, `version`, `packages`), with which `settings`, what
    its numbers depend on (`measured`: `compare` refuses files that differ there), `notes` to print beside its
    tables, the Hub datasets it read, and its tables' schemas."""

    suite: str
    version: str = ""
    packages: dict[str, str] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    measured: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    hub_datasets: list[str] = dataclasses.field(default_factory=list)
    tables: dict[str, Table] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "tables": {name: t.to_dict() for name, t in self.tables.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Section:
        return cls(**{**data, "tables": {name: Table.from_dict(t) for name, t in data.get("tables", {}).items()}})


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
    suites: dict[str, Section] = dataclasses.field(default_factory=dict)  # each suite's section, by its name
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

    def tables(self) -> dict[str, Table]:
        """The schema of every table the sections describe, in the sections' order."""
        return {name: table for section in self.suites.values() for name, table in section.tables.items()}

    def notes(self) -> list[str]:
        """What the sections say beside their tables, each once."""
        return list(dict.fromkeys(note for section in self.suites.values() for note in section.notes))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "suites": {name: s.to_dict() for name, s in self.suites.items()}}

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
        sections = {name: Section.from_dict(section) for name, section in data.pop("suites", {}).items()}
        if sections and data["format"] < 4:
            raise TypeError("suite sections before format 4")
        return Results(**data, runs=runs, suites=sections)
    except (KeyError, TypeError, AttributeError) as err:
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


def _value(cell: dict[str, Any], field: str, table: Table) -> str:
    if field not in cell:
        return f"skipped ({str(cell.get('skipped', '?'))[:60]})"
    if (bounds := interval(cell, table)) is not None and field == table.rate:
        return format_rate(cell[field], cell[table.n], *bounds) if table.n in cell else f"{cell[field]:.4g}"
    return f"{cell[field]:.4g}"


def format_rate(value: float, n: int, low: float, high: float) -> str:
    """A rate as tables print it: '0.83 [0.55, 0.95] (n=12)'."""
    return f"{value:.2f} [{low:.2f}, {high:.2f}] (n={n})"


def interval(cell: dict[str, Any], table: Table) -> tuple[float, float] | None:
    """The 95% interval of a cell's rate, or None (not a rate, skipped, or a format-2 cell)."""
    if table.rate not in cell or not table.interval or table.interval[0] not in cell:
        return None
    return cell[table.interval[0]], cell[table.interval[1]]


def described(runs: list[Run], schemas: Mapping[str, Table]) -> list[tuple[str, Table]]:
    """The metric tables the runs hold with their schemas: described ones in `schemas`' order, then any others
    (read off their cells)."""
    held = {name: cells for run in runs for name, cells in run.metrics.items()}
    order = [*schemas, *held]
    return [(name, schemas[name] if name in schemas else Table.read_off(name, held[name]))
            for name in sorted(held, key=order.index)]


def setting(table: Table, key: str) -> str:
    """A table key as tables print it: '2048 tokens', 'rotten_tomatoes'."""
    return f"{key} {table.unit}" if key.isdigit() and table.unit else key


def cell_text(name: str, table: Table, key: int | str, cell: dict[str, Any]) -> str:
    """One finished cell in a line, as a progress log prints it: 'perplexity @ 2048 tokens: 11.38'."""
    values = ", ".join(f"{field_name(name, f)} {_value(cell, f, table)}" for f in table.fields) or "done"
    return f"{name} @ {setting(table, str(key))}: {values}"


def markdown(runs: list[Run], schemas: Mapping[str, Table]) -> str:
    """One Markdown row per run, table, key and headline field: | run | metric | value |."""
    lines = ["| run | metric | value |", "|---|---|---|"]
    held = described(runs, schemas)
    for run in runs:
        for name, table in held:
            for key, cell in run.cells(name):
                for field in table.fields:
                    lines.append(f"| {run.label} | {field_name(name, field)} @ {setting(table, key)} | "
                                 f"{_value(cell, field, table)} |")
    return "\n".join(lines)


def interval_notes(runs: list[Run], schemas: Mapping[str, Table]) -> list[str]:
    """For every table cell two or more runs measured as a rate, whether each pair's 95% intervals
    overlap (the runs are not shown to differ) or are apart (they differ at that level)."""
    notes = []
    for name, table in described(runs, schemas):
        keys = sorted({key for run in runs for key, _ in run.cells(name)}, key=key_order)
        for key in keys:
            measured = [(run.label, cell) for run in runs if (cell := run.metrics.get(name, {}).get(key))
                        and interval(cell, table) and table.n in cell]
            for i, (a, ca) in enumerate(measured):
                for b, cb in measured[i + 1:]:
                    overlap = intervals_overlap(interval(ca, table), interval(cb, table))
                    verdict = ("intervals overlap: not shown to differ" if overlap
                               else "intervals apart: they differ (95%)")
                    notes.append(f"{field_name(name, table.rate)} @ {setting(table, key)}: {a} "
                                 f"{_value(ca, table.rate, table)} vs {b} {_value(cb, table.rate, table)}: {verdict}")
    return notes
