"""Recipe schema, as TRL's and the alignment-handbook's: one flat YAML whose fields belong to four dataclasses,
TRL's own `ModelConfig` and `ScriptArguments` (extended as `ModelArguments` and `DataArguments`), `PosEncArguments`
(what is positional: the swap, what trains, distillation, PoSE, the recovery evaluation) and transformers'
`TrainingArguments`, each field named as its class names it (`lora_r`, `dataset_name`, `learning_rate`, `max_steps`,
`report_to`, ...). Reading a file and its `--field value` overrides into a `Recipe` is `train.reading` (TRL's
`TrlParser`); `validate` holds the checks across fields.

Every mistake -- unknown field, wrong type, value outside the allowed set -- is a `PosEncError` naming the file,
the field and what is allowed, raised before any model or data is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from typing import Any, Literal, TypeVar, get_type_hints

import yaml
from trl.scripts.utils import ScriptArguments
from trl.trainer.model_config import ModelConfig

from ..domains import finite, matches
from ..errors import PosEncError, did_you_mean

T = TypeVar("T")
TRAINABLE_GROUPS = ("posenc", "embeddings", "norms", "head")
# task -> the data fields naming the columns its rows need (what each task does: `train.tasks`)
TASK_COLUMNS: dict[str, tuple[str, ...]] = {"causal_lm": ("text_column",),
                                            "classification": ("text_column", "label_column"),
                                            "seq2seq": ("text_column", "target_column"),
                                            "prompt_completion": ("text_column", "target_column")}

# transformers.TrainingArguments defaults a recipe changes (it may set them itself): loss rows every step, no
# reporting unless asked, the rows as the tasks make them, and DDP without the search for unused parameters
TRAINING_DEFAULTS = {"logging_steps": 1, "report_to": "none", "remove_unused_columns": False, "label_names": ["labels"],
                     "ddp_find_unused_parameters": False, "dataloader_drop_last": True}


def _yaml(value: Any) -> Any:
    """A list or mapping given on the command line as YAML text; `validate` rejects what is not one."""
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
class ModelArguments(ModelConfig):
    """TRL's `ModelConfig` (the model and its LoRA, fields as TRL's scripts name them), hf-posenc's defaults where
    TRL's differ (LoRA on every linear layer, no dropout, sdpa), and the head a recipe trains."""

    model_name_or_path: str = field(help="HF folder or Hub id, or an offline alias: 'smollm2' (SmolLM2-135M-Instruct), 'minilm-l6'")
    dtype: Literal["float32", "bfloat16", "float16"] = field("float32", help="weights dtype at load")
    attn_implementation: Literal["sdpa", "eager"] = field("sdpa", help="attention kernel")
    use_peft: bool = field(True, help="LoRA adapters; false: full fine-tuning")
    lora_alpha: float = field(32.0, help="LoRA scale numerator (scale = alpha / r)")
    lora_dropout: float = field(0.0, help="LoRA dropout")
    lora_target_modules: str | list[str] = field("all-linear", help="'all-linear' (attention + MLP projections) or module names")
    task: Literal["causal_lm", "classification", "seq2seq", "prompt_completion"] = field(
        "causal_lm", help="head to train: next-token LM, sequence classifier, an encoder-decoder "
        "(AutoModelForSeq2SeqLM) trained on input -> output pairs, labels through the decoder, or a causal LM "
        "trained on prompt -> completion rows, the loss on the completion only (TRL's prompt-completion format)")
    num_labels: int = field(2, help="classes, for task=classification")
    tokenizer_name_or_path: str | None = field(None, help="tokenizer path; defaults to the model's")


@dataclasses.dataclass
class DataArguments(ScriptArguments):
    """TRL's `ScriptArguments` (the dataset and its splits), a recipe's held-out split by default, and what a
    recipe's task reads of the rows."""

    dataset_name: str = field(help="'kjv' or 'sentiment' (offline built-ins), a datasets name, a local data file or a saved dataset folder")
    dataset_test_split: str | None = field("validation", help="split to evaluate on; if absent, eval_fraction of train is held out")
    eval_fraction: float = field(0.02, help="held-out share when there is no test split")
    text_column: str = field("text", help="column with the text")
    label_column: str = field("label", help="column with the class id (classification)")
    target_column: str = field("target", help="column with the output text (seq2seq, prompt_completion; "
                               "text_column is the input or the prompt)")
    seq_len: int = field(512, help="LM: length of the packed training blocks; classification: truncation length; "
                         "seq2seq: truncation length of inputs and of targets")
    max_train_samples: int | None = field(None, help="cap on training rows (blocks for LM)")
    max_eval_samples: int | None = field(64, help="cap on eval rows (blocks for LM)")


# TRL's fields a recipe may not change from their defaults, with why: what the run cannot honour is refused
QUANTIZED = "quantized base models are not trained here (the swap patches full-precision attention)"
UNSUPPORTED = {
    "model_revision": "model_name_or_path loads at its main revision (download another into a folder to pin it)",
    "lora_task_type": "the adapter's task follows the recipe's `task`",
    **dict.fromkeys(("load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
                     "bnb_4bit_quant_storage"), QUANTIZED),
    "dataset_streaming": "the held-out data and the packing read whole splits",
    "ignore_bias_buffers": "a DDP workaround of TRL's scripts that hf-posenc's runner does not apply",
}


@dataclasses.dataclass
class PoseArguments:
    """PoSE (Zhu et al. 2024): the recipe's `pose` mapping, typed; `validate` checks it against seq_len."""
    target_length: int = field(help="the length the window's position ids spread over, > seq_len")
    chunks: int = field(2, help="contiguous chunks of position ids, with random skips between them, 1..seq_len")


@dataclasses.dataclass
class DistillArguments:
    """Distillation from the model before the swap: the recipe's `distill` mapping, typed (defaults if not given)."""
    temperature: float = field(1.0, help="T of the softened distributions, > 0")
    weight: float = field(1.0, help="w of the KL term, >= 0")
    hidden_weight: float = field(0.0, help="h of the per-layer hidden-state MSE, >= 0 (0: none)")


@dataclasses.dataclass
class PosEncArguments:
    scheme: str | None = field(None, help="scheme to swap in (hf_posenc.list_schemes()); null keeps the model's own")
    # `| str` lets HfArgumentParser take a string, as transformers' TrainingArguments does for dicts
    scheme_options: dict[str, Any] | str | None = field(
        {}, help="the scheme's options, e.g. {factor: 4.0}; on the command line as YAML: --scheme_options '{factor: 4}'")
    scheme_layers: list[int] | str | None = field(
        None, help="the attention layers that take the scheme (the others keep the model's own positions), e.g. "
        "[3, 7, 11]; null: every layer; on the command line as YAML: --scheme_layers '[3, 7, 11]'")
    trainable: list[str] = field(
        ["posenc", "embeddings", "norms", "head"],
        help="parameter groups trained in full next to LoRA (peft's modules_to_save); LongLoRA (Chen et al. 2023) "
        "found LoRA alone does not adapt to new positions without embeddings and norms")
    extra_trainable: list[str] = field([], help="regexes of further parameter names to train in full")
    objective: Literal["lm", "distill", "lm+distill"] = field(
        "lm", help="LM only: next-token loss, distillation from the model before the swap (forward KL on every "
        "position, Hinton et al. 2015), or both summed")
    distill: dict[str, Any] | str | DistillArguments | None = field(
        {}, help="for objective distill / lm+distill: {temperature: T (1.0), weight: w (1.0), hidden_weight: h (0.0)}; "
        "loss = [lm +] w * T^2 * KL(teacher_T || student_T) + h * mean per-layer hidden-state MSE")
    pose: dict[str, Any] | str | PoseArguments | None = field(
        None, help="PoSE (Zhu et al. 2024), LM only: {target_length: N, chunks: K} trains seq_len windows on position "
        "ids split into K chunks with random skips spread over 0..N-1; null: plain positions")
    global_batch_size: int | None = field(
        None, help="sequences per optimizer step over every process: gradient_accumulation_steps is then derived from "
        "it, per_device_train_batch_size and the process count, so 1 process or N run the same batches; null: "
        "Trainer's per_device_train_batch_size x gradient_accumulation_steps x processes")
    threads: int = field(1, help="torch's CPU threads for the run (0: leave torch's count): CPU kernels split their "
                         "sums by thread, so a fixed count gives the same losses and perplexities whatever the "
                         "machine's cores or load (docs/guide/train.md: what it costs)")
    eval_original: bool = field(True, help="LM: evaluate the model before the swap too, the target a recovery aims at")
    eval_before: bool = field(True, help="evaluate the patched model before training")
    eval_after: bool = field(True, help="evaluate after training")
    eval_every_steps: int = field(0, help="evaluate every N optimizer steps (0: never): the recovery curve in "
                                  "results.json (details.curve: perplexity by steps, tokens, wall and CPU seconds)")
    perplexity_lengths: list[int] = field(
        [], help="LM: perplexity_by_length on held-out text at these lengths (seq_len is always scored, on the "
        "held-out blocks)")
    eval_max_windows: int | None = field(8, help="windows per length for perplexity_by_length")
    merge_lora: bool = field(True, help="merge LoRA into the weights; else save the base model plus adapter/")
    save_model: bool = field(True, help="save the final model in output_dir")
    plot: bool = field(True, help="write loss.png (and curve.png)")

    def __post_init__(self) -> None:
        if isinstance(self.scheme, str) and yaml.safe_load(self.scheme) is None:  # `--scheme null`
            self.scheme = None
        self.scheme_options = _yaml(self.scheme_options)
        self.scheme_options = {} if self.scheme_options is None else self.scheme_options
        self.scheme_layers, self.pose, self.distill = _yaml(self.scheme_layers), _yaml(self.pose), _yaml(self.distill)


OURS: dict[str, type] = {"model": ModelArguments, "data": DataArguments, "posenc": PosEncArguments}


def field_defaults() -> dict[str, Any]:
    """Every field of ours that has a default -> that default."""
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for cls in OURS.values() for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
# each field of the sectioned recipes before this format (model:/data:/training:/...) -> its name now
OLD_FIELDS = {
    "model.name_or_path": "model_name_or_path", "model.tokenizer": "tokenizer_name_or_path",
    "data.dataset": "dataset_name", "data.config_name": "dataset_config", "data.train_split": "dataset_train_split",
    "data.eval_split": "dataset_test_split", "data.pose": "pose", "posenc.options": "scheme_options",
    "posenc.layers": "scheme_layers", "peft.method": "use_peft (lora: true, full: false)", "peft.r": "lora_r",
    "peft.alpha": "lora_alpha", "peft.dropout": "lora_dropout", "peft.target_modules": "lora_target_modules",
    "training.batch_size": "global_batch_size", "training.micro_batch_size": "per_device_train_batch_size",
    "training.lr": "learning_rate", "training.scheduler": "lr_scheduler_type (constant: constant_with_warmup)",
    "training.mixed_precision": "bf16 or fp16 (true)", "training.deterministic": "full_determinism",
    "training.save_steps": "save_steps (0: save_strategy no)", "evaluation.micro_batch_size":
    "per_device_eval_batch_size", "evaluation.original": "eval_original", "evaluation.before": "eval_before",
    "evaluation.after": "eval_after", "evaluation.every_steps": "eval_every_steps",
    "evaluation.max_windows": "eval_max_windows", "output.dir": "output_dir", "output.merge": "merge_lora",
}


def new_name(section: str, name: str) -> str:
    """What the old field `section.name` is called now (most keep their name, without the section)."""
    return OLD_FIELDS.get(f"{section}.{name}", name)


@dataclasses.dataclass
class Recipe:
    model: ModelArguments
    data: DataArguments
    posenc: PosEncArguments
    training: Any  # transformers.TrainingArguments' fields as the recipe sets them, defaults filled in, not
    # post-processed (output_dir: the run folder); the run's TrainingArguments is `runner._arguments`
    trainer_fields: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={
        "help": "the TrainingArguments fields the recipe or the command line set (the run's arguments are built "
        "from these, with TRAINING_DEFAULTS under them)"})
    source: str = dataclasses.field(default="<dict>", compare=False, metadata={"help": "file the recipe came from"})

    def to_dict(self) -> dict[str, Any]:
        """The recipe as one flat mapping, as a recipe file writes it (TrainingArguments: the fields it set)."""
        ours = {k: v for part in (self.model, self.data, self.posenc) for k, v in dataclasses.asdict(part).items()}
        return json.loads(json.dumps({**ours, **self.trainer_fields}, default=str))  # as run.json holds it

    def accumulation(self, world: int) -> int:
        """Gradient accumulation steps on `world` processes (see `PosEncArguments.global_batch_size`)."""
        per_step = self.training.per_device_train_batch_size * world
        total = self.posenc.global_batch_size
        return self.training.gradient_accumulation_steps if total is None else max(1, total // per_step)

    def global_batch(self, world: int) -> int:
        return self.training.per_device_train_batch_size * world * self.accumulation(world)


def _check(ok: bool, source: str, where: str, message: str) -> None:
    if not ok:
        raise PosEncError(f"{source}: {where}: {message}")


def validate(recipe: Recipe) -> Recipe:
    """Cross-field checks that do not need the model or the data (TrainingArguments checked its own)."""
    s, t, p, d, m = recipe.source, recipe.training, recipe.posenc, recipe.data, recipe.model
    _check(t.max_steps >= 1 or t.max_steps == -1, s, "max_steps",
           f"must be >= 1, or -1 to train num_train_epochs epochs, got {t.max_steps}")
    _check(t.max_steps >= 1 or t.num_train_epochs > 0, s, "num_train_epochs",
           f"must be > 0 when max_steps is -1, got {t.num_train_epochs}")
    for where, value in [("per_device_train_batch_size", t.per_device_train_batch_size),
                         ("seq_len", d.seq_len), ("num_labels", m.num_labels), ("lora_r", m.lora_r),
                         ("per_device_eval_batch_size", t.per_device_eval_batch_size)]:
        _check(value >= 1, s, where, f"must be >= 1, got {value}")
    for where, value in [("threads", p.threads), ("eval_every_steps", p.eval_every_steps), ("seed", t.seed),
                         ("warmup_steps", t.warmup_steps), ("weight_decay", t.weight_decay),
                         ("max_grad_norm", t.max_grad_norm)]:
        _check(value >= 0, s, where, f"must be >= 0, got {value}")
    for where, value in [("max_train_samples", d.max_train_samples), ("max_eval_samples", d.max_eval_samples),
                         ("eval_max_windows", p.eval_max_windows), ("global_batch_size", p.global_batch_size)]:
        _check(value is None or value >= 1, s, where, f"must be >= 1 or null, got {value}")
    for name, value in [*vars(m).items(), *vars(d).items(), *vars(p).items(), *recipe.trainer_fields.items()]:
        # inf and nan pass every comparison below or none: a float is a finite number
        _check(not isinstance(value, float) or math.isfinite(value), s, name, f"must be a finite number, got {value}")
    _check(t.learning_rate > 0, s, "learning_rate", f"must be > 0, got {t.learning_rate}")
    _check(m.lora_alpha > 0, s, "lora_alpha", f"must be > 0, got {m.lora_alpha}")
    _check(0 <= m.lora_dropout < 1, s, "lora_dropout", f"must be in [0, 1), got {m.lora_dropout}")
    for part in (m, d):
        for f in dataclasses.fields(part):
            _check(f.name not in UNSUPPORTED or getattr(part, f.name) == f.default, s, f.name,
                   f"{getattr(part, f.name)!r} is not supported: {UNSUPPORTED.get(f.name)}; leave it at {f.default!r}")
    _check(0 < d.eval_fraction < 1, s, "eval_fraction", f"must be in (0, 1), got {d.eval_fraction}")
    if p.global_batch_size is not None:
        _check(p.global_batch_size % t.per_device_train_batch_size == 0, s, "global_batch_size",
               f"{p.global_batch_size} is not a multiple of per_device_train_batch_size={t.per_device_train_batch_size}")
        _check("gradient_accumulation_steps" not in recipe.trainer_fields, s, "gradient_accumulation_steps",
               "is derived from global_batch_size; set one of the two")
    bad = sorted(set(p.trainable) - set(TRAINABLE_GROUPS))
    _check(not bad, s, "trainable", f"unknown group(s) {bad}; allowed: {', '.join(TRAINABLE_GROUPS)}")
    _check(all(n >= 1 for n in p.perplexity_lengths), s, "perplexity_lengths", "lengths must be >= 1")
    _check_scheme(recipe)
    lm_only = m.task == "causal_lm"
    if p.pose is not None:
        _check(lm_only, s, "pose", "PoSE trains causal LMs only (task: causal_lm)")
        p.pose = pose = _typed_mapping(PoseArguments, p.pose, s, "pose")
        _check(pose.target_length > d.seq_len, s, "pose.target_length", f"must be > seq_len={d.seq_len} (the "
               f"window's positions spread over the target), got {pose.target_length}")
        _check(1 <= pose.chunks <= d.seq_len, s, "pose.chunks", f"must be in 1..seq_len={d.seq_len}, got {pose.chunks}")
    for where, value in [("perplexity_lengths", p.perplexity_lengths), ("eval_every_steps", p.eval_every_steps)]:
        _check(lm_only or not value, s, where, f"scores causal LMs' held-out perplexity; task {m.task!r} reports "
               "its own held-out table before and after training (leave it unset)")
    _check(p.objective == "lm" or lm_only, s, "objective",
           f"{p.objective!r} distils a causal LM; task {m.task!r} takes 'lm' only")
    _check(p.objective != "lm" or not p.distill, s, "distill",
           "given with objective 'lm'; use objective 'distill' or 'lm+distill'")
    p.distill = distill = _typed_mapping(DistillArguments, p.distill or {}, s, "distill")
    _check(distill.temperature > 0, s, "distill.temperature", f"must be > 0, got {distill.temperature}")
    _check(distill.weight >= 0, s, "distill.weight", f"must be >= 0, got {distill.weight}")
    _check(distill.hidden_weight >= 0, s, "distill.hidden_weight", f"must be >= 0, got {distill.hidden_weight}")
    return recipe


def _check_scheme(recipe: Recipe) -> None:
    """The scheme, its options and layers, as `PosEncConfig` checks them (no model needed)."""
    p, s = recipe.posenc, recipe.source
    _check(isinstance(p.scheme_options, dict), s, "scheme_options",
           f"must be a mapping such as {{factor: 4}}, got {p.scheme_options!r}")
    if p.scheme is None:
        _check(not p.scheme_options and p.scheme_layers is None, s, "scheme",
               "scheme_options or scheme_layers given without a scheme")
        return
    from ..config import PosEncConfig

    try:
        PosEncConfig(p.scheme, layers=p.scheme_layers, **p.scheme_options)
    except PosEncError as err:
        raise PosEncError(f"{s}: scheme: {err}") from None


def _typed_mapping(cls: type[T], value: Any, source: str, where: str) -> T:
    """A mapping field (`pose`, `distill`) as its dataclass: keys and types checked (the domains: `validate`)."""
    hints, fields = get_type_hints(cls), dataclasses.fields(cls)
    allowed = "; ".join(f"{f.name} ({hints[f.name].__name__}, " + ("required" if f.default is dataclasses.MISSING
                        else f"default {f.default}") + f": {f.metadata['help']})" for f in fields)
    _check(isinstance(value, dict), source, where, f"must be a mapping of {allowed}; got {value!r}")
    for name in value:
        _check(name in hints, source, where, f"unknown field {name!r}{did_you_mean(name, hints)}; allowed: {allowed}")
    for f in fields:
        item, tp = value.get(f.name, f.default), hints[f.name]
        _check(item is not dataclasses.MISSING, source, f"{where}.{f.name}", f"is required ({f.metadata['help']})")
        _check(matches(item, tp) and finite(item), source, f"{where}.{f.name}",
               f"expected a finite {tp.__name__}, got {item!r}")
    return cls(**{name: float(item) if hints[name] is float else item for name, item in value.items()})
