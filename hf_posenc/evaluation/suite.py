"""The `Suite` contract: what `hf-posenc eval --suite NAME` runs, one module per suite (`evaluation/suites/`),
registered with `register_suite` (here, beside the table it fills, `SUITES`) on its last line, as a scheme is.
Torch-free: the command line builds its flags and refuses a typo from the table before anything heavy is imported.

A suite says its name, its settings (a dataclass whose fields, with their help and domain, are its `eval`
flags), the metric tables it writes (`Metric`: headline fields, rate, direction, model-index task and dataset,
plot), which models it takes, and the cells it scores. `SuiteSettings` is what `run_suites` takes: the suites,
the lengths, what every suite shares, and each suite's own settings under its group's name.

Each settings class is a *group* of its own, named by its suite (or by `Suite.group`, which the suites sharing one
class give alike): its flags are `--GROUP.FIELD` (`--passkey.depths`, `--perplexity.max-windows`), so two suites,
or two plug-ins written apart, may name a field alike. A dotted flag says which suite reads it where it is typed,
lists under its suite in `--help`, and needs no prefix convention (`--ppl-mode`, `--lm-eval-limit`) to stay apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, ClassVar

from ..domains import domain_of
from ..errors import PosEncError
from ..results import INTERVAL, N, Plot, Table

Cell = tuple[str, "int | str", dict[str, Any]]  # (metric table, key, cell)


@dataclasses.dataclass(frozen=True)
class Metric:
    """How a suite's metric table reads: the headline fields of a cell, what its keys count, which field is a rate
    whose n and Wilson interval the cell carries, the fields where lower is better (perplexity, loss), its
    model-index task (type, name) and dataset (a function of the cell's key and the suite's settings ->
    `EvalResult` dataset fields), and its plot. Written into each results file as a `results.Table`."""

    fields: tuple[str, ...]
    key: str
    rate: str | None = None
    task: tuple[str, str] = ("text-generation", "")
    dataset: Callable[[str, Mapping[str, Any]], dict[str, Any]] | None = None
    plot: Plot | None = None
    lower_is_better: tuple[str, ...] = ()

    def table(self) -> Table:
        """The schema a results file holds (its datasets filled in as keys are written: `dataset`)."""
        return Table(self.fields, self.key, self.rate, {f: f not in self.lower_is_better for f in self.fields},
                     N if self.rate else None, INTERVAL if self.rate else None, self.task, {}, self.plot)


# results.json metric table -> how it reads, filled by `register_suite`: one meaning per table name across suites
METRICS: dict[str, Metric] = {}


def registered_tables() -> dict[str, Table]:
    """The schemas of every registered suite's tables (datasets not filled in): what a caller holding runs but no
    results file (a benchmark script, a test) prints and plots them with."""
    return {name: metric.table() for name, metric in METRICS.items()}


@dataclasses.dataclass(frozen=True)
class Scoring:
    """What every suite scores with: the model and tokenizer, the context lengths, what all suites share."""

    model: Any
    tokenizer: Any
    lengths: list[int]
    batch_size: int = 1
    seed: int = 0
    distributed: bool = False
    progress: bool = False


class Suite:
    """One evaluation suite. Subclass, set the class attributes, write `cells`, and `register_suite(YourSuite())`.

    Attributes:
        name: what `--suite` takes; aliases: other names for it (`ppl`).
        version: what results files record beside its numbers (change it when its numbers change).
        help: one line for `--suite`'s help.
        Settings: a dataclass of its settings, each field `domains.option(default, help, domain)` (one `eval`
            flag each, `--GROUP.field-name`, or `--GROUP.` and `metadata["flag"]`).
        group: the name of its settings' flags and of their values in `SuiteSettings` (default: its name); the
            suites that share one settings class give one group (the sentiment suites: "sentiment").
        metrics: the results.json tables it writes, name -> `Metric` (written into each file as a `results.Table`).
        measured_by: the settings its numbers depend on (`compare` refuses files that differ there; `measured`
            says more where a name is not enough).
        encoder_decoder: what the model's config must say (True: encoder-decoders only, False: not them,
            None: either): the check against the model, from config.json before any weights load.
        one_process: why it cannot be split over processes (`accelerate launch`), or "" when it can.
        arguments: what `NAME:a,b` names (RULER tasks, lm-eval tasks), or "" when it takes none.
        order: where it lists and its tables print (built-ins 10..90; plug-ins default after them).
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    version: ClassVar[str] = "1"
    help: ClassVar[str] = ""
    Settings: ClassVar[type | None] = None
    group: ClassVar[str] = ""
    metrics: ClassVar[Mapping[str, Metric]] = {}
    measured_by: ClassVar[tuple[str, ...]] = ()
    encoder_decoder: ClassVar[bool | None] = False
    one_process: ClassVar[str] = ""
    arguments: ClassVar[str] = ""
    order: ClassVar[int] = 100

    def argument(self, names: Sequence[str]) -> str:
        """`names` after `NAME:` checked and canonical ("" for the default set); only suites with `arguments`."""
        raise PosEncError(f"suite {self.name!r} takes no arguments (got {self.name}:{','.join(names)})")

    def check(self, settings: Any, lengths: Sequence[int]) -> None:
        """Relations between its settings (each field's own domain is checked for it), torch-free."""

    def resolve(self, settings: Any, lengths: Sequence[int]) -> Any:
        """The checked settings with defaults that depend on the lengths filled in (what runs and is recorded)."""
        return settings

    def recorded(self, settings: Any, argument: str) -> dict[str, Any]:
        """What results.json records of this suite's settings (default: every field, tuples as lists)."""
        values = dataclasses.asdict(settings) if settings is not None else {}
        return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}

    def measured(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What its numbers depend on, from its recorded settings and the shared ones (lengths, seed, dtype): a
        results file keeps it, and `compare` refuses files whose values differ (default: the `measured_by` ones)."""
        return {key: settings.get(key) for key in self.measured_by}

    def notes(self, settings: Mapping[str, Any]) -> list[str]:
        """What a reader must know beside its tables (printed under them, in the card and the comparison)."""
        return []

    def hub_datasets(self, settings: Mapping[str, Any]) -> list[str]:
        """The Hub datasets it read, given a results file's settings (a card links them)."""
        return []

    def cell_sizes(self, settings: Any, argument: str, lengths: Sequence[int]) -> list[tuple[int, int]]:
        """(sequences, tokens in each) of every cell it will score, in order: `eval`'s plan counts the cells and
        estimates their cost before the model loads ([]: it cannot tell)."""
        return []

    def cells(self, scoring: Scoring, settings: Any, argument: str) -> Iterator[Cell]:
        """Score the model: yield (table, key, cell) as each cell finishes (run_suites saves after each)."""
        raise NotImplementedError


SUITES: dict[str, Suite] = {}  # in their `order`: what `hf-posenc eval --suite` lists, tables print in


def register_suite(suite: Suite) -> Suite:
    """Make `suite` runnable by `hf-posenc eval --suite NAME` and `run_suites` (docs/extending.md); its
    metric tables readable by results, cards and plots. A name is taken once per process; a setting (a
    field of `suite.Settings`, one `eval` flag) belongs to one settings class; a metric table two suites
    write must read the same.

    Args:
        suite: a `Suite`.
    """
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} is already registered")
    if suite.Settings is not None:
        for other in SUITES.values():
            if other.Settings is suite.Settings and group_of(other) != group_of(suite):
                raise ValueError(f"suite {suite.name!r}: its settings {suite.Settings.__name__} are group "
                                 f"{group_of(other)!r} (suite {other.name!r}); give it group = {group_of(other)!r}")
            if other.Settings not in (None, suite.Settings) and group_of(other) == group_of(suite):
                raise ValueError(f"suite {suite.name!r}: settings group {group_of(suite)!r} is suite "
                                 f"{other.name!r}'s ({other.Settings.__name__}); name its group otherwise")
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


def group_of(suite: Suite) -> str:
    """The group of `suite`'s settings: its flags' `--GROUP.` and its key in `SuiteSettings`."""
    return suite.group or suite.name


def setting_groups() -> dict[str, tuple[type, list[str]]]:
    """Each settings group -> (its settings class, the suites that take it), in the suites' order: one `eval`
    argument group each."""
    groups: dict[str, tuple[type, list[str]]] = {}
    for suite in SUITES.values():
        if suite.Settings:
            groups.setdefault(group_of(suite), (suite.Settings, []))[1].append(suite.name)
    return groups


def flag(group: str, field: dataclasses.Field) -> str:
    """A setting's `eval` flag: `--GROUP.` and `metadata["flag"]` or the field's name, dashed."""
    return f"--{group}.{field.metadata.get('flag') or field.name}".replace("_", "-")


def check_domains(group: str, settings: Any) -> None:
    """Each setting within the domain its field declares (`domains.option`), named by its flag."""
    for field in dataclasses.fields(settings) if settings is not None else ():
        value, domain = getattr(settings, field.name), domain_of(field)
        if value is not None and domain is not None and domain.problem(value):
            raise PosEncError(f"{flag(group, field)} must be {domain.text().replace('an int ', 'an integer ')}, "
                              f"got {value}")


def check_settings(suite: Suite, settings: Any, lengths: Sequence[int]) -> None:
    """A suite's settings each within its domain, then the suite's own `check` of their relations."""
    check_domains(group_of(suite), settings)
    suite.check(settings, lengths)


def suite_names() -> str:
    """The suites as `--suite`'s help and errors list them: 'perplexity (ppl), passkey, ...'."""
    return ", ".join(f"{s.name} ({', '.join(s.aliases)})" if s.aliases else s.name for s in SUITES.values())


def suite_help() -> str:
    """The suites with their one-line help, for `--suite`."""
    named = ((f"{s.name} ({', '.join(s.aliases)})" if s.aliases else s.name, s.help) for s in SUITES.values())
    return "; ".join(f"{name}: {text}" for name, text in named)


def suite_of(name: str) -> tuple[Suite, str] | None:
    """The registered suite of a parsed suite name ('ruler:vt' -> (ruler, 'vt')), or None (a plug-in not
    imported now, e.g. when reading an old results file)."""
    base, _, argument = name.partition(":")
    return (SUITES[base], argument) if base in SUITES else None


def _resolve(name: str) -> str:
    return next((s.name for s in SUITES.values() if name in s.aliases), name)


def parse_suites(names: Sequence[str]) -> list[str]:
    """Suite names (or aliases) to suites, in the order given; unknown names are a PosEncError.

    A suite that takes `arguments` is `NAME` (its default set) or `NAME:a,b`, and the names after it that are
    not suites are more of its arguments (`ruler:niah_single_1,vt,ppl`): kept as `NAME:<canonical arguments>`.
    """
    parsed: list[list[Any]] = []  # [name, arguments or None]
    for name in (_resolve(n.strip()) for n in names if n.strip()):
        base, colon, rest = name.partition(":")
        if base in SUITES and SUITES[base].arguments:
            parsed.append([base, [a for a in rest.split(",") if a]])
        elif parsed and parsed[-1][1] is not None and base not in SUITES:
            parsed[-1][1].append(name)
        elif name in SUITES:
            parsed.append([name, None])
        else:
            raise PosEncError(f"unknown suite {name!r}; choose from {suite_names()}"
                              + "".join(f"; {s.name}:<a>,<b> for some {s.arguments}" for s in SUITES.values()
                                        if s.arguments))
    if not parsed:
        raise PosEncError(f"no suite given; choose from {suite_names()}")
    suites = []
    for name, arguments in parsed:
        argument = SUITES[name].argument(arguments) if arguments is not None else ""
        suites.append(f"{name}:{argument}" if argument else name)
    return list(dict.fromkeys(suites))


def check_model_kind(suites: Sequence[str], encoder_decoder: bool, model: str) -> None:
    """Each suite's check against the model: encoder-decoders take the suites made for them only, other models
    every suite but those; `model` names the model in the error."""
    takes = [s for s in suites if SUITES[s.partition(":")[0]].encoder_decoder in (None, encoder_decoder)]
    bad = [s for s in suites if s not in takes]
    if not bad:
        return
    if encoder_decoder:
        made = [s.name for s in SUITES.values() if s.encoder_decoder]
        raise PosEncError(f"{model} is an encoder-decoder model: it takes the suites {', '.join(made)} "
                          f"(input -> output pairs), not {', '.join(bad)}")
    raise PosEncError(f"{model} is not an encoder-decoder model: the suites {', '.join(bad)} need one "
                      "(AutoModelForSeq2SeqLM: T5, BART, ...)")


def check_one_process(suites: Sequence[str], what: str) -> None:
    """Suites that run in one process refuse a split over several (`what` says how it was asked for)."""
    for name in suites:
        suite = SUITES[name.partition(":")[0]]
        if suite.one_process:
            raise PosEncError(f"the {suite.name} suite runs in one process ({suite.one_process}): {what}")


@dataclasses.dataclass(init=False)
class SuiteSettings:
    """What `run_suites` scores and how: `hf-posenc eval` builds it from its flags; results.json records it.

    Args:
        suites, lengths: the suites (names, aliases, `NAME:arguments`) and context lengths in tokens.
        name: the model's name or path, for the results; scheme, options: the patch applied after loading.
        batch_size, seed: shared by every suite that batches or draws.
        dtype: the model's dtype as loaded, recorded for `compare` (default: read from the model).
        baseline: if the model is patched, then unpatch it and score it again with the same settings
            (the run "<name> (unpatched)": the original model, when `scheme` patched it here; "<name> (its own
            weights, <native> positions)" when it came patched: a trained folder with its native scheme back);
            the model stays unpatched.
        original: the model a trained or patched folder came from (a package name, a folder, a Hub id), loaded and
            scored with the same settings as one more baseline row, "<original> (original model)"; None: none.
        distributed: split windows, prompts and sentences over the processes of the torch.distributed
            group (`accelerate launch`); every process must call `run_suites` alike, and gets the same
            results as one process would; only the first writes files.
        **values: the suites' own settings, by group and field name (`perplexity={"max_windows": 1}`,
            `ruler={"samples": 3}`; `hf-posenc eval --help` lists them as `--GROUP.FIELD`); a suite not run
            ignores its group.
    """

    suites: Sequence[str]
    lengths: Sequence[int]
    name: str | None
    scheme: str | None
    options: dict[str, Any]
    batch_size: int
    seed: int
    dtype: str | None
    baseline: bool
    original: str | None
    distributed: bool
    values: dict[str, dict[str, Any]]

    def __init__(self, suites: Sequence[str], lengths: Sequence[int], name: str | None = None,
                 scheme: str | None = None, options: dict[str, Any] | None = None, *, batch_size: int = 1,
                 seed: int = 0, dtype: str | None = None, baseline: bool = False, original: str | None = None,
                 distributed: bool = False, **values: Mapping[str, Any]) -> None:
        groups = setting_groups()
        for group, given in values.items():
            if group not in groups:
                raise PosEncError(f"unknown suite settings group {group!r}; the registered suites' groups are "
                                  f"{', '.join(groups)}")
            names = [field.name for field in dataclasses.fields(groups[group][0])]
            if unknown := sorted(set(given) - set(names)):
                raise PosEncError(f"unknown {group} settings {', '.join(unknown)}; {group} takes {', '.join(names)}")
        values = {group: dict(given) for group, given in values.items()}
        self.suites, self.lengths, self.name, self.scheme = suites, lengths, name, scheme
        self.options, self.batch_size, self.seed, self.dtype = dict(options or {}), batch_size, seed, dtype
        self.baseline, self.original, self.distributed, self.values = baseline, original, distributed, values

    def of(self, suite: Suite) -> Any:
        """The suite's own settings (its `Settings` built from the values given, defaults for the rest)."""
        return suite.Settings(**self.values.get(group_of(suite), {})) if suite.Settings else None

    def replace(self, **changes: Any) -> SuiteSettings:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "values"}
        return SuiteSettings(**{**fields, **self.values, **changes})
