"""Recipe schema: one dataclass per YAML section, and the checks across fields (`validate`); reading a
file and its overrides into these is `train.reading`.

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
import math
import typing
from typing import Any, Callable, Literal

import yaml

from ..errors import PosEncError, did_you_mean
from ..domains import matches

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
    name_or_path: str = field(help="HF folder or Hub id, or an offline alias: 'smollm2' (SmolLM2-135M-Instruct), 'minilm-l6'")
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

    layers: list[int] | str | None = field(
        None, help="the attention layers that take the scheme (the others keep the model's own positions), e.g. "
        "[3, 7, 11]; null: every layer; on the command line as YAML: --posenc.layers '[3, 7, 11]'")

    def __post_init__(self) -> None:
        if isinstance(self.scheme, str) and yaml.safe_load(self.scheme) is None:  # `--posenc.scheme null`
            self.scheme = None
        if isinstance(self.options, str):  # from the command line; validate() rejects what is not a mapping
            with contextlib.suppress(yaml.YAMLError):
                self.options = yaml.safe_load(self.options)
        if self.options is None:
            self.options = {}
        if isinstance(self.layers, str):  # from the command line; PosEncConfig rejects what is not a list
            with contextlib.suppress(yaml.YAMLError):
                self.layers = yaml.safe_load(self.layers)


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
    threads: int = field(1, help="torch's CPU threads for the run (0: leave torch's count): CPU kernels split their "
                         "sums by thread, so a fixed count gives the same losses and perplexities whatever the "
                         "machine's cores or load (docs/guide/train.md: what it costs)")
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
    trainer: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={
        "help": "further fields of transformers' TrainingArguments, by their own names (report_to, optim, "
        "use_liger_kernel, torch_compile, ...); those the other sections set are refused (`TRAINER_FIELDS`)"})
    source: str = dataclasses.field(default="<dict>", compare=False, metadata={"help": "file the recipe came from"})

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data


SECTIONS: dict[str, type] = typing.get_type_hints(Recipe)
SECTIONS.pop("source")
SECTIONS.pop("trainer")  # a mapping checked against TrainingArguments (`reading`), not a section of ours
# transformers.TrainingArguments fields the recipe's sections set -> the recipe field that sets them
TRAINER_FIELDS = {
    "output_dir": "output.dir", "max_steps": "training.max_steps", "per_device_train_batch_size":
    "training.micro_batch_size", "gradient_accumulation_steps": "training.batch_size", "learning_rate": "training.lr",
    "weight_decay": "training.weight_decay", "warmup_steps": "training.warmup_steps",
    "lr_scheduler_type": "training.scheduler", "max_grad_norm": "training.max_grad_norm",
    "bf16": "training.mixed_precision", "fp16": "training.mixed_precision", "seed": "training.seed",
    "data_seed": "training.seed", "gradient_checkpointing": "training.gradient_checkpointing",
    "save_strategy": "training.save_steps", "save_steps": "training.save_steps",
    "save_total_limit": "training.save_total_limit", "logging_steps": "training.logging_steps",
    "full_determinism": "training.deterministic", "use_cpu": "the launch (--accelerate-config)",
}


def unknown_field(name: str, allowed: list[str], where: str) -> PosEncError:
    """The error for a field name not in `allowed`, with the closest one as a hint."""
    return PosEncError(f"{where}: unknown field {name!r}{did_you_mean(name, allowed)}; allowed: {', '.join(allowed)}")


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
                         ("training.weight_decay", t.weight_decay), ("training.seed", t.seed),
                         ("training.threads", t.threads)]:
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
            PosEncConfig(recipe.posenc.scheme, layers=recipe.posenc.layers, **recipe.posenc.options)
        except PosEncError as err:
            raise PosEncError(f"{s}: posenc: {err}") from None
    elif recipe.posenc.options or recipe.posenc.layers is not None:
        raise PosEncError(f"{s}: posenc.options or posenc.layers given without posenc.scheme")
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
            raise unknown_field(name, list(keys), f"{source}: {where}")
    filled = {}
    for name, (tp, default, rule) in keys.items():
        item = value.get(name, default)
        _check(item is not None, source, f"{where}.{name}", f"is required ({tp.__name__}, {rule})")
        _check(matches(item, tp) and (tp is not float or math.isfinite(item)), source, f"{where}.{name}",
               f"expected a finite {tp.__name__} ({rule}), got {item!r}")
        filled[name] = float(item) if tp is float else item
    return filled
