"""Recipe schema: one dataclass per YAML section, parsed by transformers' `HfArgumentParser`.

A recipe is a YAML file with the sections `model`, `posenc`, `peft`, `data`, `training`,
`evaluation` and `output` (TRL / alignment-handbook style); `--section.field value` (or
`--field value` for a name only one section has) overrides a field, as TRL's `TrlParser` lets a
command line override its config file. Every mistake -- unknown field, wrong type, value outside the
allowed set -- is a `PosEncError` naming the file, the field and what is allowed, raised before any
model or data is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, NoReturn

import yaml

from ..errors import PosEncError
from .shipped import recipe_path

TRAINABLE_GROUPS = ("posenc", "embeddings", "norms", "head")
# model.task -> the data fields naming the columns its rows need (what each task does: `train.tasks`)
TASK_COLUMNS: dict[str, tuple[str, ...]] = {"causal_lm": ("text_column",),
                                            "classification": ("text_column", "label_column"),
                                            "seq2seq": ("text_column", "target_column")}


# The keys of the recipe's small mappings, with their type, default and domain (checked by `_check_mapping`).
POSE_KEYS: dict[str, tuple[type, Any, str]] = {
    "target_length": (int, None, "> data.seq_len"), "chunks": (int, 2, ">= 1 and <= data.seq_len")}
DISTILL_KEYS: dict[str, tuple[type, Any, str]] = {
    "temperature": (float, 1.0, "> 0"), "weight": (float, 1.0, ">= 0"), "hidden_weight": (float, 0.0, ">= 0")}
BOUNDS: dict[str, Callable[[float], bool]] = {"> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0}


def _yaml_mapping(value: Any) -> Any:
    """A mapping given on the command line as YAML text; validate() rejects what is not a mapping."""
    if isinstance(value, str):
        with contextlib.suppress(yaml.YAMLError):
            return yaml.safe_load(value)
    return value


def field(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A dataclass field with help text (peft style); mutable defaults go through default_factory."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return dataclasses.field(default=default, metadata={"help": help}, **kw)


@dataclasses.dataclass
class ModelArgs:
    name_or_path: str = field(help="HF folder or Hub id, or an offline alias: 'smollm2' (SmolLM2-135M), 'minilm-l6'")
    task: Literal["causal_lm", "classification", "seq2seq"] = field(
        "causal_lm", help="head to train: next-token LM, sequence classifier, or an encoder-decoder "
        "(AutoModelForSeq2SeqLM) trained on input -> output pairs, labels through the decoder")
    num_labels: int = field(2, help="classes, for task=classification")
    tokenizer: str | None = field(None, help="tokenizer path; defaults to the model's")
    dtype: Literal["float32", "bfloat16", "float16"] = field("float32", help="weights dtype at load")
    attn_implementation: Literal["sdpa", "eager"] = field("sdpa", help="attention kernel")


@dataclasses.dataclass
class PosEncArgs:
    scheme: str | None = field(None, help="scheme to swap in (hf_posenc.list_schemes()); null keeps the model's own")
    # `| str | None` makes HfArgumentParser take a string, as transformers' TrainingArguments does for dicts
    options: dict[str, Any] | str | None = field(
        {}, help="the scheme's options, e.g. {factor: 4.0}; on the command line as YAML: --posenc.options '{factor: 4}'")

    def __post_init__(self) -> None:
        if isinstance(self.options, str):  # from the command line; validate() rejects what is not a mapping
            with contextlib.suppress(yaml.YAMLError):
                self.options = yaml.safe_load(self.options)
        if self.options is None:
            self.options = {}


@dataclasses.dataclass
class PeftArgs:
    method: Literal["lora", "full"] = field("lora", help="LoRA adapters, or full fine-tuning")
    r: int = field(16, help="LoRA rank")
    alpha: float = field(32.0, help="LoRA scale numerator (scale = alpha / r)")
    dropout: float = field(0.0, help="LoRA dropout")
    target_modules: str | list[str] = field("all-linear", help="'all-linear' (attention + MLP projections) or module names")
    trainable: list[str] = field(
        ["posenc", "embeddings", "norms", "head"],
        help="parameter groups trained in full next to LoRA; LongLoRA (Chen et al. 2023) found LoRA alone "
        "does not adapt to new positions without embeddings and norms",
    )
    extra_trainable: list[str] = field([], help="regexes of further parameter names to train in full")

    def __post_init__(self) -> None:
        if self.target_modules == ["all-linear"]:  # the command line gives a list of one
            self.target_modules = "all-linear"


@dataclasses.dataclass
class DataArgs:
    dataset: str = field(help="'kjv' or 'sentiment' (offline built-ins), a datasets name, a local data file or a saved dataset folder")
    config_name: str | None = field(None, help="datasets config name")
    train_split: str = field("train", help="split to train on")
    eval_split: str | None = field("validation", help="split to evaluate on; if absent, eval_fraction of train is held out")
    eval_fraction: float = field(0.02, help="held-out share when there is no eval split")
    text_column: str = field("text", help="column with the text")
    label_column: str = field("label", help="column with the class id (classification)")
    target_column: str = field("target", help="column with the output text (seq2seq; text_column is the input)")
    seq_len: int = field(512, help="LM: length of the packed training blocks; classification: truncation length; "
                         "seq2seq: truncation length of inputs and of targets")
    max_train_samples: int | None = field(None, help="cap on training rows (blocks for LM)")
    max_eval_samples: int | None = field(64, help="cap on eval rows (blocks for LM)")
    pose: dict[str, Any] | str | None = field(
        None, help="PoSE (Zhu et al. 2024), LM only: {target_length: N, chunks: K} trains seq_len windows on position "
        "ids split into K chunks with random skips spread over 0..N-1; null: plain positions. "
        "On the command line as YAML: --data.pose '{target_length: 512, chunks: 2}'")

    def __post_init__(self) -> None:
        self.pose = _yaml_mapping(self.pose)


@dataclasses.dataclass
class TrainingArgs:
    max_steps: int = field(help="optimizer steps")
    batch_size: int = field(8, help="GLOBAL sequences per optimizer step: the same on 1 process or N")
    micro_batch_size: int = field(1, help="sequences per process per forward; accumulation fills the rest")
    lr: float = field(2e-4, help="peak learning rate")
    weight_decay: float = field(0.0, help="AdamW weight decay")
    warmup_steps: int = field(0, help="linear warmup steps")
    scheduler: Literal["constant", "linear", "cosine"] = field("cosine", help="decay after warmup")
    max_grad_norm: float = field(1.0, help="gradient clipping; 0 disables")
    mixed_precision: Literal["no", "bf16", "fp16"] = field("no", help="autocast precision")
    gradient_checkpointing: bool = field(False, help="non-reentrant activation checkpointing")
    seed: int = field(42, help="model init, data order and dropout")
    save_steps: int = field(0, help="checkpoint every N steps (0: never)")
    save_total_limit: int = field(2, help="checkpoints kept")
    logging_steps: int = field(1, help="loss log interval")
    deterministic: bool = field(False, help="torch.use_deterministic_algorithms, for bit-exact resumes")
    objective: Literal["lm", "distill", "lm+distill"] = field(
        "lm", help="LM only: next-token loss, distillation from the model before the swap (forward KL on every "
        "position, Hinton et al. 2015), or both summed")
    distill: dict[str, Any] | str | None = field(
        {}, help="for objective distill / lm+distill: {temperature: T (1.0), weight: w (1.0), hidden_weight: h (0.0)}; "
        "loss = [lm +] w * T^2 * KL(teacher_T || student_T) + h * mean per-layer hidden-state MSE")

    def __post_init__(self) -> None:
        self.distill = _yaml_mapping(self.distill) or {}


@dataclasses.dataclass
class EvaluationArgs:
    original: bool = field(True, help="LM: evaluate the model before the swap too, the target a recovery aims at")
    before: bool = field(True, help="evaluate the patched model before training")
    after: bool = field(True, help="evaluate after training")
    micro_batch_size: int = field(4, help="eval sequences per forward")
    perplexity_lengths: list[int] = field(
        [], help="LM: perplexity_by_length on held-out text at these lengths (data.seq_len is always scored, "
        "on the held-out blocks)")
    max_windows: int | None = field(8, help="windows per length for perplexity_by_length")
    every_steps: int = field(0, help="evaluate every N optimizer steps (0: never): the recovery curve in results.json "
                             "(details.curve: perplexity by steps, tokens, wall and CPU seconds) and loss.png")


@dataclasses.dataclass
class OutputArgs:
    dir: str = field(help="run folder: model, checkpoints/, loss.json, loss.png, results.json")
    merge: bool = field(True, help="merge LoRA into the weights; else save the base model plus adapter/")
    save_model: bool = field(True, help="save the final model")
    plot: bool = field(True, help="write loss.png")


@dataclasses.dataclass
class Recipe:
    model: ModelArgs
    data: DataArgs
    training: TrainingArgs
    output: OutputArgs
    posenc: PosEncArgs = dataclasses.field(default_factory=PosEncArgs)
    peft: PeftArgs = dataclasses.field(default_factory=PeftArgs)
    evaluation: EvaluationArgs = dataclasses.field(default_factory=EvaluationArgs)
    source: str = dataclasses.field(default="<dict>", compare=False, metadata={"help": "file the recipe came from"})

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data


SECTIONS: dict[str, type] = typing.get_type_hints(Recipe)
SECTIONS.pop("source")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """Whether a parsed value has type `tp` (YAML gives typed values; argparse only converts strings)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if tp in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if tp is float else tp)


def _unknown(name: str, allowed: list[str], where: str) -> PosEncError:
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return PosEncError(f"{where}: unknown field {name!r}{hint}; allowed: {', '.join(allowed)}")


@functools.cache
def _section_parser() -> type:
    """The parser class, built on first use: transformers is imported only once the YAML, the sections
    and the field names are known to be right, so those mistakes are refused at once."""
    from transformers import HfArgumentParser

    class SectionParser(HfArgumentParser):
        """HfArgumentParser over one section, its values from YAML as defaults (TrlParser's way); argparse's
        errors become PosEncErrors naming the file and the section."""

        def __init__(self, cls: type, values: dict[str, Any], where: str) -> None:
            super().__init__(cls, prog=where, add_help=False, allow_abbrev=False)
            self.where = where
            defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                        for f in dataclasses.fields(cls)}
            self.set_defaults(**{k: v for k, v in {**defaults, **values}.items() if v is not dataclasses.MISSING})
            for action in self._actions:
                action.required = action.required and action.dest not in values

        def error(self, message: str) -> NoReturn:
            raise PosEncError(f"{self.where}: {message}")

    return SectionParser


def _section_values(cls: type, values: Any, where: str) -> dict[str, Any]:
    """A section's YAML mapping, its field names checked (before any section is parsed)."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise PosEncError(f"{where}: a section is a mapping of fields, got {type(values).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    for name in values:
        if name not in names:
            raise _unknown(name, names, where)
    return values


def _build_section(cls: type, values: dict[str, Any], argv: list[str], where: str) -> Any:
    """The section's dataclass from its checked YAML mapping and its `--field value` overrides, type-checked."""
    try:
        (built,) = _section_parser()(cls, values, where).parse_args_into_dataclasses(argv, look_for_args_file=False)
    except PosEncError:
        raise
    except ValueError as err:  # values left over: `--lr 1 2`
        raise PosEncError(f"{where}: {err}") from None
    for name, tp in typing.get_type_hints(cls).items():
        value = getattr(built, name)
        if not _matches(value, tp):
            raise PosEncError(f"{where}.{name}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
        if tp is float:
            setattr(built, name, float(value))
    return built


def _check(ok: bool, source: str, where: str, message: str) -> None:
    if not ok:
        raise PosEncError(f"{source}: {where}: {message}")


def validate(recipe: Recipe) -> Recipe:
    """Cross-field checks that do not need the model or the data."""
    s, t, p, d, e = recipe.source, recipe.training, recipe.peft, recipe.data, recipe.evaluation
    for where, value in [("training.max_steps", t.max_steps), ("training.batch_size", t.batch_size),
                         ("training.micro_batch_size", t.micro_batch_size), ("data.seq_len", d.seq_len),
                         ("model.num_labels", recipe.model.num_labels), ("evaluation.micro_batch_size", e.micro_batch_size),
                         ("training.logging_steps", t.logging_steps), ("peft.r", p.r)]:
        _check(value >= 1, s, where, f"must be >= 1, got {value}")
    for where, value in [("training.warmup_steps", t.warmup_steps), ("training.save_steps", t.save_steps),
                         ("training.save_total_limit", t.save_total_limit), ("training.max_grad_norm", t.max_grad_norm),
                         ("training.weight_decay", t.weight_decay), ("training.seed", t.seed)]:
        _check(value >= 0, s, where, f"must be >= 0, got {value}")
    for where, value in [("data.max_train_samples", d.max_train_samples), ("data.max_eval_samples", d.max_eval_samples),
                         ("evaluation.max_windows", e.max_windows)]:
        _check(value is None or value >= 1, s, where, f"must be >= 1 or null, got {value}")
    for section in SECTIONS:  # inf and nan pass every comparison below or none: a float is a finite number
        for name, value in vars(getattr(recipe, section)).items():
            _check(not isinstance(value, float) or math.isfinite(value), s, f"{section}.{name}",
                   f"must be a finite number, got {value}")
    _check(t.lr > 0, s, "training.lr", f"must be > 0, got {t.lr}")
    _check(p.alpha > 0, s, "peft.alpha", f"must be > 0, got {p.alpha}")
    _check(0 <= p.dropout < 1, s, "peft.dropout", f"must be in [0, 1), got {p.dropout}")
    _check(0 < d.eval_fraction < 1, s, "data.eval_fraction", f"must be in (0, 1), got {d.eval_fraction}")
    _check(t.batch_size % t.micro_batch_size == 0, s, "training.batch_size",
           f"{t.batch_size} is not a multiple of training.micro_batch_size={t.micro_batch_size}")
    bad = sorted(set(p.trainable) - set(TRAINABLE_GROUPS))
    _check(not bad, s, "peft.trainable", f"unknown group(s) {bad}; allowed: {', '.join(TRAINABLE_GROUPS)}")
    _check(all(n >= 1 for n in e.perplexity_lengths), s, "evaluation.perplexity_lengths", "lengths must be >= 1")
    _check(isinstance(recipe.posenc.options, dict), s, "posenc.options",
           f"must be a mapping such as {{factor: 4}}, got {recipe.posenc.options!r}")
    if recipe.posenc.scheme is not None:
        from ..config import PosEncConfig

        try:
            PosEncConfig(recipe.posenc.scheme, **recipe.posenc.options)
        except PosEncError as err:
            raise PosEncError(f"{s}: posenc: {err}") from None
    elif recipe.posenc.options:
        raise PosEncError(f"{s}: posenc.options given without posenc.scheme")
    _check(e.every_steps >= 0, s, "evaluation.every_steps", f"must be >= 0 (0: never), got {e.every_steps}")
    lm_only = recipe.model.task == "causal_lm"
    if d.pose is not None:
        _check(lm_only, s, "data.pose", "PoSE trains causal LMs only (model.task: causal_lm)")
        d.pose = _check_mapping(d.pose, POSE_KEYS, s, "data.pose")
        _check(d.pose["target_length"] > d.seq_len, s, "data.pose.target_length",
               f"must be > data.seq_len={d.seq_len} (the window's positions spread over the target), "
               f"got {d.pose['target_length']}")
        _check(1 <= d.pose["chunks"] <= d.seq_len, s, "data.pose.chunks",
               f"must be in 1..data.seq_len={d.seq_len}, got {d.pose['chunks']}")
    for where, value in [("evaluation.perplexity_lengths", e.perplexity_lengths), ("evaluation.every_steps", e.every_steps)]:
        _check(lm_only or not value, s, where, f"scores causal LMs' held-out perplexity; model.task "
               f"{recipe.model.task!r} reports its own held-out table before and after training (leave it unset)")
    _check(t.objective == "lm" or lm_only, s, "training.objective",
           f"{t.objective!r} distils a causal LM; model.task {recipe.model.task!r} takes 'lm' only")
    _check(t.objective != "lm" or not t.distill, s, "training.distill",
           "given with training.objective 'lm'; use objective 'distill' or 'lm+distill'")
    t.distill = _check_mapping(t.distill, DISTILL_KEYS, s, "training.distill")
    for key, (_, _, rule) in DISTILL_KEYS.items():
        _check(BOUNDS[rule](t.distill[key]), s, f"training.distill.{key}", f"must be {rule}, got {t.distill[key]}")
    return recipe


def _check_mapping(value: Any, keys: dict[str, tuple[type, Any, str]], source: str, where: str) -> dict[str, Any]:
    """A small mapping field with its defaults filled in, its keys and types checked (domains: the caller)."""
    allowed = ", ".join(f"{k} ({tp.__name__}, {rule})" for k, (tp, _, rule) in keys.items())
    _check(isinstance(value, dict), source, where, f"must be a mapping of {allowed}; got {value!r}")
    for name in value:
        if name not in keys:
            raise _unknown(name, list(keys), f"{source}: {where}")
    filled = {}
    for name, (tp, default, rule) in keys.items():
        item = value.get(name, default)
        _check(item is not None, source, f"{where}.{name}", f"is required ({tp.__name__}, {rule})")
        _check(_matches(item, tp) and (tp is not float or math.isfinite(item)), source, f"{where}.{name}",
               f"expected a finite {tp.__name__} ({rule}), got {item!r}")
        filled[name] = float(item) if tp is float else item
    return filled


def _route(overrides: list[str], source: str) -> dict[str, list[str]]:
    """`--section.field v ...` or `--field v ...` (a name only one section has) -> {section: ["--field", "v", ...]}."""
    fields = {section: [f.name for f in dataclasses.fields(cls)] for section, cls in SECTIONS.items()}
    routed: dict[str, list[str]] = {}
    section = None
    for arg in overrides:
        if not arg.startswith("--"):
            if section is None:
                raise PosEncError(f"override {arg!r} must come after --section.field (or --field)")
            routed[section].append(arg)
            continue
        key, sep, value = arg[2:].partition("=")
        name = key.replace("-", "_")
        if "." in name:
            section, name = name.split(".", 1)
            if section not in fields:
                raise _unknown(section, list(fields), f"{source}: override {arg}")
            if name not in fields[section]:
                raise _unknown(name, fields[section], f"{source}: override {arg}: {section}")
        else:
            owners = [sec for sec, names in fields.items() if name in names]
            if not owners:
                raise _unknown(name, [f"{s}.{n}" for s, names in fields.items() for n in names], f"{source}: override {arg}")
            if len(owners) > 1:
                raise PosEncError(f"override {arg} is ambiguous: use one of {', '.join(f'--{o}.{name}' for o in owners)}")
            section = owners[0]
        routed.setdefault(section, []).extend([f"--{name}", value] if sep else [f"--{name}"])
    return routed


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe YAML, apply command-line overrides, validate everything.

    Args:
        path: the YAML file, or a shipped recipe's name (`smollm2-135m/alibi/smoke`, `hf-posenc recipes`).
        overrides: argv-style, e.g. ["--training.lr", "1e-4", "--max_steps", "10", "--peft.target_modules", "q_proj", "v_proj"].
    """
    path = recipe_path(path)
    if not path.is_file():
        raise PosEncError(f"recipe {str(path)!r} not found" + (" (it is a folder; give the YAML file)" if path.is_dir()
                                                                 else "; give a recipe YAML file or a shipped recipe's "
                                                                 "name (`hf-posenc recipes`)"))
    return from_dict(read_yaml(path, "recipe") or {}, source=str(path), overrides=overrides)


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file, or one line naming the file, the line and column, and PyYAML's reason (not its dump)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise PosEncError(f"{path}: the {what} is not a text file; give a YAML file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        reason = " ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None)))) or str(err)
        raise PosEncError(f"{path}: {where}the {what} is not valid YAML ({' '.join(reason.split())})") from None


def from_dict(data: Any, source: str = "<dict>", overrides: list[str] | None = None) -> Recipe:
    """Build and validate a Recipe from a nested mapping (a parsed YAML file) and argv-style overrides."""
    if not isinstance(data, dict):
        raise PosEncError(f"{source}: a recipe is a mapping of sections {', '.join(SECTIONS)}")
    for name in data:
        if name not in SECTIONS:
            raise _unknown(name, list(SECTIONS), f"{source}: top level")
    missing = [n for n in ("model", "data", "training", "output") if n not in data]
    if missing:
        raise PosEncError(f"{source}: missing section(s) {', '.join(missing)}")
    routed = _route(overrides or [], source)
    values = {name: _section_values(cls, data.get(name), f"{source}: {name}") for name, cls in SECTIONS.items()}
    sections = {name: _build_section(cls, values[name], routed.get(name, []), f"{source}: {name}")
                for name, cls in SECTIONS.items()}
    return validate(Recipe(**sections, source=source))
