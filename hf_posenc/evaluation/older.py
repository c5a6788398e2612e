"""Results files of formats 2 and 3, which hold numbers only, read as format 4: each gets the sections the suites
that wrote its tables would write now (`sections.section` of the built-in suites' definitions, from the file's flat
settings), so cards, comparisons and tables read every format alike. A table of a plug-in not installed now gets
none and is read off its cells."""

from __future__ import annotations

import os
from typing import Any

from .. import results
from . import held_out, sections
from .suite import SUITES, Suite, suite_of

# how perplexity was measured where a file says no mode (format 2, before modes): the demo scored the first L tokens
BEFORE_MODES = {"demo": "perplexity of the first L tokens"}


def load_results(path: str | os.PathLike) -> results.Results:
    """A results.json of any format this hf-posenc reads (`results.READS`), with its sections; formats 2 and 3 get
    theirs from the built-in suites. Anything else is a PosEncError naming its format (`results.load`)."""
    record = results.load(path)
    if record.format < 4:
        record.suites = described(record)
    return record


def described(record: results.Results) -> dict[str, results.Section]:
    """The sections of a format-2/3 record: training's held-out tables, or one per registered suite whose tables
    the runs hold."""
    if record.kind == "train":
        return {held_out.NAME: held_out.section(record)}
    settings: dict[str, Any] = {key: value for key, value in record.settings.items() if key != "suite"}
    if "perplexity_mode" not in settings and record.kind in BEFORE_MODES:
        settings["method"] = BEFORE_MODES[record.kind]
    held = {table for run in record.runs for table in run.metrics}
    ran = [found[0] for name in record.settings.get("suite", []) if (found := suite_of(name))]
    built: dict[str, results.Section] = {}
    for suite in [*ran, *SUITES.values()]:  # the suites it says it ran first: sst2's table is also rotten_tomatoes'
        tables = held & set(suite.metrics)
        if (tables or suite in ran) and suite.name not in built:
            built[suite.name] = _section(suite, settings, record, tables)
            held -= tables
    return built


def _section(suite: Suite, settings: dict[str, Any], record: results.Results, tables: set[str]) -> results.Section:
    section = sections.section(suite, settings)
    for run in record.runs:
        for table in tables & set(run.metrics):
            for key in run.metrics[table]:
                sections.wrote(section, suite, table, key)
    return section
