"""Comparing results files: which settings their numbers depend on, and `compare` (one table, plots)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import plots, results
from ..errors import PosEncError
from .names import PERPLEXITY_MODES
from .suite import suite_of


def measured_with(record: results.Results) -> dict[str, Any]:
    """What a results file's numbers depend on besides the model and the table key: two files whose
    values here differ do not measure the same thing (another text, window count, dtype, method)."""
    settings = record.settings
    if record.kind == "train":
        data_, evaluation = settings.get("data", {}), settings.get("evaluation", {})
        return {"method": "held-out blocks of the training data", "text": data_.get("dataset"),
                "dtype": settings.get("model", {}).get("dtype"), "max_windows": evaluation.get("max_windows")}
    if record.kind == "demo":
        return {"method": _method(settings, "perplexity of the first L tokens"), "text": settings.get("text"),
                **{key: settings[key] for key in ("max_windows", "target_tokens") if key in settings},
                **_places(settings)}
    # the settings each suite it ran says its numbers depend on (none for a plug-in suite not imported now)
    ran = [found[0] for name in settings.get("suite", []) if (found := suite_of(name))]
    keys = {key for suite in ran for key in suite.measured_by}
    # how perplexity was measured, where the file holds perplexity (a file of other suites compares on those)
    method = ({"method": _method(settings, PERPLEXITY_MODES["sliding"])}
              if any(run.metrics.get("perplexity") for run in record.runs) else {})
    return {**method, **(_places(settings) if method else {}), "dtype": settings.get("dtype"),
            **{key: settings.get(key) for key in keys}}


def _places(settings: dict[str, Any]) -> dict[str, Any]:
    """Where same_target's windows end follows from the longest length asked for (the room it leaves before the
    first end): files whose longest lengths differ scored other tokens at every length (7.54 against 10.90)."""
    lengths = settings.get("lengths") or []
    return {"longest_length": max(lengths)} if settings.get("perplexity_mode") == "same_target" and lengths else {}


def _method(settings: dict[str, Any], before_modes: str) -> str:
    """How perplexity was measured: the file's `perplexity_mode`, or what files written before modes did."""
    return PERPLEXITY_MODES.get(settings.get("perplexity_mode"), before_modes)


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
    loaded = list(records) if records is not None else [results.load(path) for path in paths]
    differ = differing_settings(loaded, mixed)
    settings = [measured_with(record) for record in loaded]
    runs = []
    for number, record in enumerate(loaded, 1):
        for run in record.runs:
            runs.append(dataclasses.replace(run, label=f"{run.label} [{number}]") if differ else run)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = results.markdown(runs)
    notes = results.interval_notes(runs)
    if notes:
        table += "\n\n95% Wilson intervals of the same cell in two runs:\n" + "\n".join(f"- {n}" for n in notes)
    places = dict.fromkeys(results.scored_places(record.settings) for record in loaded
                           if any(run.metrics.get("perplexity") for run in record.runs) and record.kind != "train")
    if places:  # beside every perplexity table, as eval prints it
        table += "\n\nScored places:\n" + "\n".join(f"- {place}" for place in places)
    if differ:
        table += "\n\n" + "\n".join(f"[{n}] {path}: " + ", ".join(f"{k}={s.get(k)}" for k in differ)
                                    for n, (path, s) in enumerate(zip(paths, settings), 1))
    (out / "compare.md").write_text(table + "\n")
    results.write_json(out / "compare.json", {"files": [str(p) for p in paths], "differ": differ,
                                              "results": [record.to_dict() for record in loaded]})
    plots.results_by_length(runs, out)
    return table
