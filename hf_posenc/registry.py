"""The tables SCHEMES, ADAPTERS, SUITES and METRICS, and `register_*` to fill them: a leaf every module may import.

Schemes, adapters and evaluation suites register themselves at import (peft-style); names must be unique.
Questions about the tables (which adapter, which schemes, why not) are `hf_posenc.catalog`'s, about suites
`hf_posenc.evaluation.suite`'s: they sit above what registers here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .adapters.base import Adapter
    from .evaluation.suite import Suite
    from .results import Metric
    from .schemes.base import Scheme

# What `hf-posenc list` prints and the built-in schemes' options `PosEncConfig` checks, written by
# `catalog.write_snapshot()`: the catalog imports torch, the list and the option checks must not.
SNAPSHOT = Path(__file__).with_name("support.json")
# The generic adapter's verdict per causal-LM model type, checked by the zoo sweep (benchmarks/zoo_catalog.py).
MODEL_TYPES = Path(__file__).with_name("model_types.json")
# The same for encoder-decoder model types, stack by stack (benchmarks/seq2seq_catalog.py).
SEQ2SEQ_TYPES = Path(__file__).with_name("seq2seq_types.json")
SCHEMES: dict[str, "Scheme"] = {}
ADAPTERS: dict[str, "Adapter"] = {}  # model_type -> adapter
SUITES: dict[str, "Suite"] = {}  # in their `order`: what `hf-posenc eval --suite` lists, tables print in
METRICS: dict[str, "Metric"] = {}  # results.json metric table -> how it reads (written by suites and training)


def register_scheme(scheme: "Scheme") -> "Scheme":
    """Make `scheme` patchable by its name (docs/extending.md); a name is taken once per process.

    Args:
        scheme: an instance of a `hf_posenc.schemes.base` site class (`BiasScheme`, `RotaryScheme`, ...).
    """
    if scheme.name in SCHEMES:
        raise ValueError(f"scheme {scheme.name!r} is already registered")
    SCHEMES[scheme.name] = scheme
    return scheme


def register_adapter(adapter: "Adapter") -> "Adapter":
    """Use `adapter` instead of the generic one for its model types (docs/extending.md); once per type.

    Args:
        adapter: a `hf_posenc.adapters.base.Adapter` naming where positions enter those model types.
    """
    for model_type in adapter.model_types:  # all checked before any is taken: no half-registered adapter
        if model_type in ADAPTERS:
            raise ValueError(f"model_type {model_type!r} already has adapter {ADAPTERS[model_type].name!r}")
    ADAPTERS.update(dict.fromkeys(adapter.model_types, adapter))
    return adapter


def register_suite(suite: "Suite") -> "Suite":
    """Make `suite` runnable by `hf-posenc eval --suite NAME` and `run_suites` (docs/extending.md); its
    metric tables readable by results, cards and plots. A name is taken once per process; a setting (a
    field of `suite.Settings`, one `eval` flag) belongs to one settings class; a metric table two suites
    write must read the same.

    Args:
        suite: a `hf_posenc.evaluation.suite.Suite`.
    """
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} is already registered")
    owners = {f.name: other.Settings for other in SUITES.values() if other.Settings
              for f in dataclasses.fields(other.Settings)}
    for field in dataclasses.fields(suite.Settings) if suite.Settings else ():
        if owners.get(field.name, suite.Settings) is not suite.Settings:
            raise ValueError(f"suite {suite.name!r}: setting {field.name!r} is already "
                             f"{owners[field.name].__name__}'s (one flag each); name it otherwise")
    for name, metric in suite.metrics.items():  # all checked before any is taken: no half-registered suite
        if METRICS.get(name, metric) != metric:
            raise ValueError(f"suite {suite.name!r}: metric table {name!r} is already registered as {METRICS[name]}")
    ordered = sorted([*SUITES.values(), suite], key=lambda s: s.order)  # stable: equal orders keep import order
    SUITES.clear()
    SUITES.update((s.name, s) for s in ordered)
    tables = {name: metric for s in ordered for name, metric in s.metrics.items()}  # tables in the suites' order
    tables.update(METRICS)
    METRICS.clear()
    METRICS.update(tables)
    return suite


def register_metric(name: str, metric: "Metric") -> "Metric":
    """A results.json metric table that is not (only) a suite's, e.g. what a training task writes; the
    same table registered twice must read the same."""
    if METRICS.get(name, metric) != metric:
        raise ValueError(f"metric table {name!r} is already registered as {METRICS[name]}")
    METRICS.setdefault(name, metric)
    return metric
