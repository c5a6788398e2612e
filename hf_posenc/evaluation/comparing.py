"""Comparing results files: which settings their numbers depend on, and `compare` (one table, plots)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import plots, results
from ..errors import PosEncError
from .older import load_results


def measured_with(record: results.Results) -> dict[str, Any]:
    """What a results file's numbers depend on besides the model and the table key, as its sections say: the
    dtype, each suite's `measured` values (`suite.setting`), and which suite measured each table (the same table
    scored by eval's suite and by training's held-out blocks is not the same measurement). Two files whose values
    here differ do not measure the same thing (another text, window count, dtype, method)."""
    measured: dict[str, Any] = {"dtype": record.settings.get("dtype")}
    for name, section in record.suites.items():
        measured.update({f"{name}.{key}": value for key, value in section.measured.items()})
        measured.update({f"{table} measured by": name for table in section.tables
                         if any(table in run.metrics for run in record.runs)})
    return measured


def differing_settings(records: Sequence[results.Results], mixed: bool = False) -> list[str]:
    """The `measured_with` keys whose values differ between the results files that have them;
    refused unless `mixed`."""
    settings = [measured_with(record) for record in records]
    differ = sorted({key for s in settings for key in s if len({repr(t[key]) for t in settings if key in t}) > 1})
    if differ and not mixed:
        raise PosEncError(f"these results were measured differently ({', '.join(differ)} differ), so their "
                          "numbers do not compare; pass --mixed to put them in one table anyway (it says what differs)")
    return differ


def compare(paths: Sequence[str | Path], out: str | Path, *, records: Sequence[results.Results] | None = None,
            mixed: bool = False) -> str:
    """Every run of several results files (eval, train or demo) in one table: writes out/compare.md,
    out/compare.json (the files' contents) and the plots; returns the table.

    Files measured differently (`measured_with`: text, windows, dtype, method) are refused unless
    `mixed`, in which case each run is marked with its file and the table ends with what differs.
    For every rate two runs both measured, the table says whether their 95% intervals overlap.
    """
    loaded = list(records) if records is not None else [load_results(path) for path in paths]
    differ = differing_settings(loaded, mixed)
    settings = [measured_with(record) for record in loaded]
    runs = []
    for number, record in enumerate(loaded, 1):
        for run in record.runs:
            runs.append(dataclasses.replace(run, label=f"{run.label} [{number}]") if differ else run)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    schemas = {name: spec for record in loaded for name, spec in record.tables().items()}
    table = results.markdown(runs, schemas)
    notes = results.interval_notes(runs, schemas)
    if notes:
        table += "\n\n95% Wilson intervals of the same cell in two runs:\n" + "\n".join(f"- {n}" for n in notes)
    said = list(dict.fromkeys(note for record in loaded for note in record.notes()))
    if said:  # what each suite says beside its tables, as eval prints it
        table += "\n\nNotes:\n" + "\n".join(f"- {note}" for note in said)
    if differ:
        table += "\n\n" + "\n".join(f"[{n}] {path}: " + ", ".join(f"{k}={s.get(k)}" for k in differ)
                                    for n, (path, s) in enumerate(zip(paths, settings), 1))
    (out / "compare.md").write_text(table + "\n")
    results.write_json(out / "compare.json", {"files": [str(p) for p in paths], "differ": differ,
                                              "results": [record.to_dict() for record in loaded]})
    plots.results_by_length(runs, schemas, out)
    return table
