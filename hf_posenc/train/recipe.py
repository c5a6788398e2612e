"""Recipe schema: one dataclass per YAML section, validated field by field.

A recipe is a YAML file with the sections `model`, `posenc`, `peft`, `data`, `training`,
`evaluation` and `output` (TRL / alignment-handbook style). Every mistake -- unknown field, wrong
type, value outside the allowed set -- is a `PosEncError` naming the file, the field and what is
allowed, raised before any model or data is loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from ..errors import PosEncError

TRAINABLE_GROUPS = ("posenc", "embeddings", "norms", "head")


def field(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A dataclass field with help text (peft style); mutable defaults go through default_factory."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return dataclasses.field(default=default, metadata={"help": help}, **kw)


@dataclasses.dataclass
class ModelArgs:
    name_or_path: str = field(help="HF folder or Hub id, or an offline alias: 'smollm2' (SmolLM2-135M), 'minilm-l6'")
    task: Literal["causal_lm", "classification"] = field("causal_lm", help="head to train")
    num_labels: int = field(2, help="classes, for task=classification")
    tokenizer: str | None = field(None, help="tokenizer path; defaults to the model's")
    dtype: Literal["float32", "bfloat16", "float16"] = field("float32", help="weights dtype at load")
    attn_implementation: Literal["sdpa", "eager"] = field("sdpa", help="attention kernel")


@dataclasses.dataclass
class PosEncArgs:
    scheme: str | None = field(None, help="scheme to swap in (hf_posenc.list_schemes()); null keeps the model's own")
    options: dict[str, Any] = field({}, help="the scheme's options, e.g. {factor: 4.0}")


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


@dataclasses.dataclass
class DataArgs:
    dataset: str = field(help="'kjv' or 'sentiment' (offline built-ins), a datasets name, a local data file or a saved dataset folder")
    config_name: str | None = field(None, help="datasets config name")
    train_split: str = field("train", help="split to train on")
    eval_split: str | None = field("validation", help="split to evaluate on; if absent, eval_fraction of train is held out")
    eval_fraction: float = field(0.02, help="held-out share when there is no eval split")
    text_column: str = field("text", help="column with the text")
    label_column: str = field("label", help="column with the class id (classification)")
    seq_len: int = field(512, help="LM: length of the packed training blocks; classification: truncation length")
    max_train_samples: int | None = field(None, help="cap on training rows (blocks for LM)")
    max_eval_samples: int | None = field(64, help="cap on eval rows (blocks for LM)")


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


@dataclasses.dataclass
class EvaluationArgs:
    original: bool = field(True, help="LM: evaluate the model before the swap too, the target a recovery aims at")
    before: bool = field(True, help="evaluate the patched model before training")
    after: bool = field(True, help="evaluate after training")
    micro_batch_size: int = field(4, help="eval sequences per forward")
    perplexity_lengths: list[int] = field([], help="LM: perplexity_by_length on held-out text at these lengths")
    max_windows: int | None = field(8, help="windows per length for perplexity_by_length")


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


def _coerce(value: Any, tp: Any) -> Any:
    """Return `value` as type `tp`, or raise TypeError. YAML reads `2e-4` as a string: accept it for floats."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise TypeError
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg)
            except (TypeError, ValueError):
                continue
        raise TypeError
    if tp is type(None):
        if value is None:
            return None
        raise TypeError
    if origin is list:
        if not isinstance(value, list):
            raise TypeError
        return [_coerce(v, typing.get_args(tp)[0]) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            return float(value)  # ValueError if not a number
        raise TypeError
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeError
    raise TypeError


def _unknown(name: str, allowed: list[str], where: str) -> PosEncError:
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return PosEncError(f"{where}: unknown field {name!r}{hint}; allowed: {', '.join(allowed)}")


def _build_section(cls: type, values: Any, source: str, section: str) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise PosEncError(f"{source}: section {section!r} must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in values.items():
        if name not in hints:
            raise _unknown(name, fields, f"{source}: {section}")
        try:
            kwargs[name] = _coerce(value, hints[name])
        except (TypeError, ValueError):
            raise PosEncError(
                f"{source}: {section}.{name}: expected {_type_name(hints[name])}, got {value!r} ({type(value).__name__})"
            ) from None
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise PosEncError(f"{source}: {section}: missing required field(s) {', '.join(missing)} ({cls.__name__})")
    return cls(**kwargs)


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
                         ("training.weight_decay", t.weight_decay)]:
        _check(value >= 0, s, where, f"must be >= 0, got {value}")
    _check(t.lr > 0, s, "training.lr", f"must be > 0, got {t.lr}")
    _check(0 <= p.dropout < 1, s, "peft.dropout", f"must be in [0, 1), got {p.dropout}")
    _check(0 < d.eval_fraction < 1, s, "data.eval_fraction", f"must be in (0, 1), got {d.eval_fraction}")
    _check(t.batch_size % t.micro_batch_size == 0, s, "training.batch_size",
           f"{t.batch_size} is not a multiple of training.micro_batch_size={t.micro_batch_size}")
    bad = sorted(set(p.trainable) - set(TRAINABLE_GROUPS))
    _check(not bad, s, "peft.trainable", f"unknown group(s) {bad}; allowed: {', '.join(TRAINABLE_GROUPS)}")
    _check(all(n >= 1 for n in e.perplexity_lengths), s, "evaluation.perplexity_lengths", "lengths must be >= 1")
    if recipe.posenc.scheme is not None:
        from ..config import PosEncConfig

        try:
            PosEncConfig(recipe.posenc.scheme, **recipe.posenc.options)
        except PosEncError as err:
            raise PosEncError(f"{s}: posenc: {err}") from None
    elif recipe.posenc.options:
        raise PosEncError(f"{s}: posenc.options given without posenc.scheme")
    return recipe


def from_dict(data: Any, source: str = "<dict>") -> Recipe:
    """Build and validate a Recipe from a nested mapping (a parsed YAML file)."""
    if not isinstance(data, dict):
        raise PosEncError(f"{source}: a recipe is a mapping of sections {', '.join(SECTIONS)}")
    sections = {}
    for name, values in data.items():
        if name not in SECTIONS:
            raise _unknown(name, list(SECTIONS), f"{source}: top level")
        sections[name] = _build_section(SECTIONS[name], values, source, name)
    missing = [n for n in ("model", "data", "training", "output") if n not in sections]
    if missing:
        raise PosEncError(f"{source}: missing section(s) {', '.join(missing)}")
    return validate(Recipe(**sections, source=source))


def parse_overrides(pairs: list[str], source: str) -> dict[str, dict[str, Any]]:
    """`--training.lr 1e-4` or `--lr 1e-4` (if the field name is unique) -> {"training": {"lr": "1e-4"}}."""
    fields = {sec: [f.name for f in dataclasses.fields(cls)] for sec, cls in SECTIONS.items()}
    out: dict[str, dict[str, Any]] = {}
    if len(pairs) % 2:
        raise PosEncError(f"overrides come in pairs `--section.field value`; got {' '.join(pairs)}")
    for key, raw in zip(pairs[::2], pairs[1::2]):
        if not key.startswith("--"):
            raise PosEncError(f"override {key!r} must look like --section.field (or --field)")
        name = key[2:].replace("-", "_")
        if "." in name:
            section, fname = name.split(".", 1)
            if section not in fields:
                raise _unknown(section, list(fields), f"{source}: override {key}")
            if fname not in fields[section]:
                raise _unknown(fname, fields[section], f"{source}: override {key}: {section}")
        else:
            owners = [sec for sec, names in fields.items() if name in names]
            if len(owners) != 1:
                everything = [f"{sec}.{n}" for sec, names in fields.items() for n in names]
                if not owners:
                    raise _unknown(name, everything, f"{source}: override {key}")
                raise PosEncError(f"override {key} is ambiguous: use one of {', '.join(f'--{o}.{name}' for o in owners)}")
            section, fname = owners[0], name
        out.setdefault(section, {})[fname] = yaml.safe_load(raw)
    return out


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe YAML, apply `--section.field value` overrides, validate everything.

    Args:
        path: the YAML file.
        overrides: flat list like ["--training.lr", "1e-4", "--max_steps", "10"].
    """
    path = Path(path)
    if not path.is_file():
        raise PosEncError(f"recipe {str(path)!r} not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise PosEncError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise PosEncError(f"{path}: a recipe is a mapping of sections {', '.join(SECTIONS)}")
    for section, values in parse_overrides(overrides or [], str(path)).items():
        if not isinstance(data.get(section) or {}, dict):
            raise PosEncError(f"{path}: section {section!r} must be a mapping")
        data[section] = {**(data.get(section) or {}), **values}
    return from_dict(data, source=str(path))
