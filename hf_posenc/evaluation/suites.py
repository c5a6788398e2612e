"""Suites: the scores `hf-posenc eval` runs by name, written to results.json as they finish, and `compare`."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .. import data, plots, results
from ..errors import PosEncError
from ..patching import describe, unpatch
from ..seq2seq import is_seq2seq
from ..stats import rate_fields
from .long_context import default_target, passkey, perplexity_by_length, tokens_needed
from .names import (DEFAULT_MODE, PERPLEXITY_MODES, SENTIMENT, SEQ2SEQ_SUITES, check_mode, check_model_kind,
                    parse_suites, parse_tasks)
from .processes import main_process_first, rank_and_world
from .ruler import HAYSTACK, ruler_scores
from .scoring import check_lengths, text_token_ids
from .tasks import classification, length_generalization, seq2seq_length_generalization


def ruler_tasks(suites: Sequence[str]) -> list[str]:
    """The RULER tasks a parsed suite list runs (none if it has no ruler suite)."""
    return next((parse_tasks(s.removeprefix("ruler").removeprefix(":").split(",")) for s in suites
                 if s.startswith("ruler")), [])


@dataclasses.dataclass
class SuiteSettings:
    """What `run_suites` scores and how: `hf-posenc eval` builds it from its flags; results.json records it.

    Args:
        suites, lengths: the suites (`names.SUITES`) and context lengths in tokens.
        name: the model's name or path, for the results; scheme, options: the patch applied after loading.
        text, text_config, text_column: the long text for perplexity ("kjv" offline, or a datasets name).
        stride, max_windows, batch_size: see `perplexity_by_length`; depths, trials: see `passkey`.
        perplexity_mode, target_tokens: `perplexity_by_length`'s mode and target (same_target: the same
            `target_tokens` tokens, default half the shortest length, are scored at every length).
        samples, gen_tokens: RULER prompts per task and length, and the cap on answer tokens (see `ruler_scores`).
        task_lengths, examples: digits and examples per length of the synthetic tasks.
        limit: score only the first `limit` sentences of a sentiment suite.
        dtype: the model's dtype as loaded, recorded for `compare` (default: read from the model).
        baseline: if the model is patched, then unpatch it and score it again with the same settings
            (the run "<name> (unpatched)": the original model, when `scheme` patched it here; "<name> (its own
            weights, <native> positions)" when it came patched: a trained folder with its native scheme back);
            the model stays unpatched.
        distributed: split windows, prompts and sentences over the processes of the torch.distributed
            group (`accelerate launch`); every process must call `run_suites` alike, and gets the same
            results as one process would; only the first writes files.
    """

    suites: Sequence[str]
    lengths: Sequence[int]
    name: str | None = None
    scheme: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    text: str = "kjv"
    text_config: str | None = None
    text_column: str = "text"
    stride: int | None = None
    max_windows: int | None = 4
    perplexity_mode: str = DEFAULT_MODE
    target_tokens: int | None = None
    batch_size: int = 1
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0)
    trials: int = 4
    samples: int = 20
    gen_tokens: int | None = None
    task_lengths: Sequence[int] = (2, 4, 8, 16)
    examples: int = 20
    limit: int | None = None
    seed: int = 0
    dtype: str | None = None
    baseline: bool = False
    distributed: bool = False


def _checked(model: PreTrainedModel, settings: SuiteSettings) -> SuiteSettings:
    """The settings with suites, lengths and perplexity target resolved, refused before anything runs."""
    suites = parse_suites(settings.suites)
    check_model_kind(suites, is_seq2seq(model), type(model).__name__)
    if settings.distributed and ruler_tasks(suites):
        raise PosEncError("the ruler suite runs in one process (lm-eval's generate loop): run it without distributed")
    lengths = check_lengths(settings.lengths)
    check_mode(settings.perplexity_mode, settings.stride)
    target = settings.target_tokens
    if settings.perplexity_mode == "same_target" and target is None:
        target = default_target(lengths)
    elif settings.perplexity_mode == "sliding":
        target = None  # sliding windows score every token once
    return dataclasses.replace(settings, suites=suites, lengths=lengths, target_tokens=target)


def run_suites(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: SuiteSettings,
               out: str | Path) -> results.Results:
    """Run suites on an in-memory model; `out/results.json` is rewritten after every length, so what
    finished survives a crash, and the plots are drawn at the end.

    Args:
        settings: what to score and how (see `SuiteSettings`).
        out: the folder of results.json and the plots.
    """
    s = _checked(model, settings)
    out = Path(out)
    rank, world = rank_and_world(s.distributed)
    main = rank == 0
    if main:
        out.mkdir(parents=True, exist_ok=True)
    name = s.name or type(model).__name__
    run = results.Run(results.run_label(name, s.scheme, s.options or {}), s.scheme, dict(s.options or {}),
                      getattr(model.config, "posenc", None) if describe(model) else None)
    record = results.Results("eval", name, runs=[run], settings={
        "suite": s.suites, "lengths": s.lengths, "text": s.text, "text_config": s.text_config, "stride": s.stride,
        "max_windows": s.max_windows, "perplexity_mode": s.perplexity_mode, "target_tokens": s.target_tokens,
        "batch_size": s.batch_size, "depths": list(s.depths), "trials": s.trials, "samples": s.samples,
        "gen_tokens": s.gen_tokens, **({"haystack": HAYSTACK} if ruler_tasks(s.suites) else {}),
        "task_lengths": list(s.task_lengths), "examples": s.examples, "limit": s.limit, "seed": s.seed,
        "dtype": s.dtype or str(model.dtype).removeprefix("torch.")},
        details={"processes": world})
    path = out / "results.json"

    def save(complete: bool = False) -> None:
        if main:
            record.save(path, complete=complete)

    save()
    peaks = record.details.setdefault("peak_memory_mb", {})
    reset_peak_memory(model.device)
    _score(model, tokenizer, s, run, save, progress=main)
    peaks[run.label] = peak_memory_mb(model.device)
    if s.baseline and describe(model) is not None:
        native = (getattr(model.config, "posenc", None) or {}).get("from") or "native"
        unpatch(model)
        # patched here: unpatched is the original model; loaded patched (a trained folder): its own weights
        label = "(unpatched)" if s.scheme else f"(its own weights, {native} positions)"
        record.runs.append(results.Run(f"{Path(name).name or name} {label}"))
        reset_peak_memory(model.device)
        _score(model, tokenizer, s, record.runs[-1], save, progress=main)
        peaks[record.runs[-1].label] = peak_memory_mb(model.device)
    save(complete=True)
    if main:
        plots.results_by_length(record.runs, out)
    return record


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


def _score(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, s: SuiteSettings, run: results.Run,
           save: Callable[[], None], progress: bool) -> None:
    """One run's suites, saving the record after every cell."""
    shared = {"progress": progress, "distributed": s.distributed}

    def put(metric: str, key: int | str, cell: dict[str, Any]) -> None:
        run.put(metric, key, cell)
        save()

    if "perplexity" in s.suites:
        with main_process_first(s.distributed):
            source = data.long_text(s.text, text_column=s.text_column, config=s.text_config)
        ids = text_token_ids(tokenizer, source, tokens_needed(s.perplexity_mode, s.lengths, s.max_windows, s.stride))
        for length in s.lengths:  # one call per length, so each is saved as it finishes
            put("perplexity", length,
                perplexity_by_length(model, ids, [length], s.stride, s.batch_size, s.max_windows,
                                     mode=s.perplexity_mode, target=s.target_tokens, longest=max(s.lengths),
                                     **shared)[length])
    if "passkey" in s.suites:
        for length in s.lengths:
            cell = passkey(model, tokenizer, [length], s.depths, s.trials, seed=s.seed + length, **shared)[length]
            if "by_depth" in cell:
                cell["by_depth"] = {str(d): acc for d, acc in cell["by_depth"].items()}
            put("passkey", length, cell)
    for task in ruler_tasks(s.suites):
        for length in s.lengths:
            scores = ruler_scores(model, tokenizer, [task], [length], s.samples, seed=s.seed, gen_tokens=s.gen_tokens)
            put(f"ruler {task}", length, scores[task][length])
    for suite, (dataset, config, split) in SENTIMENT.items():
        if suite in s.suites:
            with main_process_first(s.distributed):
                rows = data.sentiment_dataset(dataset, config=config, seed=s.seed)[split]
            put("classification", suite,
                classification(model, tokenizer, rows, batch_size=max(s.batch_size, 16), limit=s.limit, **shared))
    for task in data.SYNTHETIC_TASKS:
        if task in s.suites:
            for length in check_lengths(list(s.task_lengths), "task length"):
                shots = data.synthetic_task(task, length, 3, seed=s.seed + 1000)
                prefix = "".join(f"{p}{t}\n" for p, t in zip(shots["prompt"], shots["target"]))
                examples = data.synthetic_task(task, length, s.examples, s.seed)
                scored = length_generalization(model, tokenizer, examples, prefix=prefix,
                                               batch_size=max(s.batch_size, 8), **shared)
                put(task, length, _exact_match(scored, len(examples)))
    for suite in SEQ2SEQ_SUITES:
        if suite in s.suites:
            for length in check_lengths(list(s.task_lengths), "task length"):
                pairs = data.seq2seq_pairs(suite.removeprefix("seq2seq_"), length, s.examples, s.seed)
                scored = seq2seq_length_generalization(model, tokenizer, pairs, batch_size=max(s.batch_size, 8),
                                                       **shared)
                put(suite, length, _exact_match(scored, len(pairs)))


def _exact_match(scored: dict[str, Any], n: int) -> dict[str, Any]:
    """A synthetic task's cell: exact match over `n` examples with its 95% Wilson interval."""
    return {"exact_match": scored["exact_match"], **rate_fields(round(scored["exact_match"] * n), n)}


# eval settings that change the numbers of a suite (a file is compared on those of the suites it ran)
SUITE_SETTINGS = {"perplexity": ("text", "text_config", "stride", "max_windows", "target_tokens"),
                  "passkey": ("depths", "trials", "seed"),
                  **{suite: ("limit", "seed") for suite in SENTIMENT},
                  **{task: ("examples", "seed") for task in (*data.SYNTHETIC_TASKS, *SEQ2SEQ_SUITES)},
                  "ruler": ("samples", "gen_tokens", "seed", "haystack")}


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
                **{key: settings[key] for key in ("max_windows", "target_tokens") if key in settings}}
    keys = {key for suite in settings.get("suite", []) for key in SUITE_SETTINGS.get(suite.partition(":")[0], ())}
    return {"method": _method(settings, PERPLEXITY_MODES["sliding"]), "dtype": settings.get("dtype"),
            **{key: settings.get(key) for key in keys}}


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
    if differ:
        table += "\n\n" + "\n".join(f"[{n}] {path}: " + ", ".join(f"{k}={s.get(k)}" for k in differ)
                                    for n, (path, s) in enumerate(zip(paths, settings), 1))
    (out / "compare.md").write_text(table + "\n")
    results.write_json(out / "compare.json", {"files": [str(p) for p in paths], "differ": differ,
                                              "results": [record.to_dict() for record in loaded]})
    plots.results_by_length(runs, out)
    return table
