"""A suite's section of a results file (`results.Section`): what the suite is, its settings, what its numbers
depend on, its notes and its tables' schemas, written as data so a reader without the suite's code (a plug-in
uninstalled since, another machine) reads the file as the suite meant it."""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from typing import Any

from .. import results
from .suite import Suite


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def packages(suite: Suite) -> dict[str, str]:
    """The installed packages that measured: hf-posenc and the distribution the suite's module comes from (none
    for a `--suite-module` file)."""
    top = type(suite).__module__.partition(".")[0]
    found = {}
    for name in ("hf-posenc", *_distributions().get(top, ())):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def section(suite: Suite, settings: Mapping[str, Any]) -> results.Section:
    """The section `suite` writes, given its recorded settings with the shared ones (lengths, seed, dtype)."""
    settings = dict(settings)
    return results.Section(suite.name, suite.version, packages(suite), settings, suite.measured(settings),
                           suite.notes(settings), suite.hub_datasets(settings),
                           {name: metric.table() for name, metric in suite.metrics.items()})


def wrote(section: results.Section, suite: Suite, table: str, key: int | str) -> None:
    """Record the model-index dataset of a key the suite wrote (its `Metric.dataset` of the key and settings)."""
    metric = suite.metrics[table]
    if metric.dataset is not None:
        section.tables[table].datasets[str(key)] = metric.dataset(str(key), section.settings)
