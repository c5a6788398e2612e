"""A recipe's run on transformers' `Trainer`: setup (the checks, the swap, the Trainer with the held-out data) ->
`Trainer.train` (which scores the model before the swap, then evaluates as `eval_strategy` / `eval_on_start` say and
at the last step) -> finish (results.json, plots, the model). What may be written where is `run_folder`'s; the loss,
the held-out tables, the curve and the labelled bar are `trainer`'s."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType
from transformers import TrainingArguments, set_seed
from transformers.trainer_callback import ProgressCallback
from trl import SFTConfig

from .. import folders, plots, results
from ..errors import PosEncError
from ..evaluation import held_out, processes
from ..patching import describe
from ..progress import waiting
from ..results import write_json
from . import inputs, modeling, objectives, scope, tasks
from .recipe import Recipe
from .run_folder import CHECKPOINTS, RUN_FILE, STATE_FILE, Checked, checkpoints, preflight
from .trainer import LabelledProgress, PositionalPieces, RecoveryCallback, StopOnSignal


def train(recipe: Recipe, resume: bool | str = False, overwrite: bool = False,
          checked: Checked | None = None) -> results.Results:
    """Run a recipe under whatever `accelerate launch` set up; returns what it wrote to results.json:
    the runs "original" (LM only), "before training" and "after training", as the recipe's eval_* fields allow.

    Args:
        recipe: a validated Recipe (see `load_recipe`).
        resume: continue from the latest checkpoint in `output_dir` (True: there must be one;
            "auto": if there is one).
        overwrite: replace the run in `output_dir`.
        checked: what `preflight` found, when the caller ran it (then `resume` and `overwrite` are unused);
            else it runs here.

    Raises:
        Interrupted: at Ctrl-C or SIGTERM, once the step under way is saved where the recipe saves (`StopOnSignal`).
    """
    stop = StopOnSignal()
    # `threads`, `full_determinism` (Trainer sets it) and accelerate's state, and the signal handlers: this run only
    with scope.run_only(), stop.listening():
        run = _setup(recipe, resume, overwrite, checked, stop)
        run.trainer.train(resume_from_checkpoint=str(run.latest) if run.latest else None)
        stop.stopped()
        return _finish(run)


@dataclasses.dataclass
class Session:
    """A run's live parts, made by `_setup`, used by `_finish`."""

    recipe: Recipe
    trainer: PositionalPieces
    callback: RecoveryCallback
    record: results.Results
    tokenizer: Any
    task: tasks.Task
    data: inputs.Prepared
    latest: Path | None

    @property
    def out(self) -> Path:
        return Path(self.recipe.training.output_dir)


def _arguments(recipe: Recipe, out: Path, world: int, cpu: bool, configured: bool = False,
               resumed: bool = False) -> TrainingArguments:
    """The recipe's TrainingArguments fields as this run takes them, in its trainer's arguments class (an `SFTConfig`
    for a causal LM, `Seq2SeqTrainingArguments` for an encoder-decoder): checkpoints in
    `out/checkpoints`, the accumulation that makes `global_batch_size` on `world` processes, the launch's device,
    non-reentrant checkpointing unless the recipe says otherwise, evaluation every `eval_every_steps` and on start
    (`eval_before`) unless the recipe sets Trainer's own fields (a resumed run has its first evaluation).
    `configured`: the caller made an Accelerator before the run, whose state (its precision, its FSDP plugin)
    Trainer then uses instead of resetting it."""
    fields, p = recipe.trainer_fields, recipe.posenc
    checkpointing = {"gradient_checkpointing_kwargs": {"use_reentrant": False}} \
        if fields.get("gradient_checkpointing") and not fields.get("gradient_checkpointing_kwargs") else {}
    every = {"eval_strategy": "steps", "eval_steps": p.eval_every_steps} if p.eval_every_steps else {}
    cls = tasks.TRAINING_TASKS[recipe.model.task].trainer.arguments
    sft = _sft_fields(recipe) if cls is SFTConfig else {}
    return cls(**{
        "disable_tqdm": not sys.stderr.isatty(), **every, "eval_on_start": p.eval_before, **sft, **fields,
        **checkpointing, **({"eval_on_start": False} if resumed else {}), "output_dir": str(out / CHECKPOINTS),
        "gradient_accumulation_steps": recipe.accumulation(world), "use_cpu": cpu,
        **({"accelerator_config": {"use_configured_state": True}} if configured else {})})


def _sft_fields(recipe: Recipe) -> dict[str, Any]:
    """SFTConfig's own fields as a recipe means them, and TrainingArguments' defaults where SFTConfig's differ (its
    learning rate, logging steps, gradient checkpointing, bf16 on a GPU), so a recipe trains as it says on either:
    a causal LM's text packed into `seq_len` blocks as one stream (TRL's "wrapped"; "bfd" fits documents into rows
    instead), prompt -> completion rows cut at `seq_len`, the loss on the completion only."""
    stock = {f.name: _default(f) for f in dataclasses.fields(TrainingArguments) if f.init}
    changed = {f.name: stock[f.name] for f in dataclasses.fields(SFTConfig) if f.name in stock and
               _default(f) != stock[f.name]}
    lm = recipe.model.task == "causal_lm"
    return {**changed, "max_length": recipe.data.seq_len, "packing": lm, "packing_strategy": "wrapped",
            "completion_only_loss": not lm}


def _default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def _setup(recipe: Recipe, resume: bool | str, overwrite: bool, checked: Checked | None, stop: StopOnSignal) -> Session:
    """Preflight (unless done), the model before the swap scored, the swap, the Trainer (`stop` among its callbacks);
    the run folder marked unfinished and run.json written. Training (and its evaluation before the first step) is
    `Trainer.train`'s."""
    out = Path(recipe.training.output_dir)
    configured = bool(AcceleratorState._shared_state)  # an Accelerator of the caller's: Trainer keeps its state
    joined = processes.join()  # torchrun without an accelerator means N CPU processes over gloo
    world = joined.num_processes
    raw, resume, overwrite = checked or preflight(recipe, resume, overwrite, world)  # before any compute
    fsdp = _fsdp(recipe, joined.distributed_type)
    record = results.Results("train", recipe.model.model_name_or_path, settings=recipe.to_dict())  # its clock starts
    if overwrite and joined.is_main_process and (out / RUN_FILE).is_file():
        shutil.rmtree(out)
    joined.wait_for_everyone()
    latest = checkpoints(out)[-1] if resume and checkpoints(out) else None
    args = _arguments(recipe, out, world, cpu=joined.device.type == "cpu", configured=configured,
                      resumed=latest is not None)
    scope.threads(recipe.posenc.threads)
    set_seed(recipe.training.seed)  # the patch's and LoRA's initialisation; Trainer seeds the run itself
    with waiting(f"loading {recipe.model.model_name_or_path} and preparing the data ({recipe.data.dataset_name})",
                 show=joined.is_main_process):
        model, tokenizer = modeling.load_recipe_model(recipe)
        task = tasks.TRAINING_TASKS[recipe.model.task]
        data = task.prepare(recipe, inputs.load_raw(recipe) if raw is None else raw, tokenizer)
    objective, teacher = objectives.build(recipe, model, fsdp)
    # the model before the swap, sharing its tensors: peft trains copies of what trains in full, so it stays itself;
    # taken, like the teacher, before SFTTrainer puts its fused LM head on the student's forward
    before_swap = copy.deepcopy(model, memo={id(t): t for t in [*model.parameters(), *model.buffers()]})
    student = modeling.select_trainable(model, recipe, modeling.apply_posenc(model, recipe))
    if teacher is not None:
        _report_teacher(teacher.freeze_trained() / 2**20, fsdp, world, joined.is_main_process)
    with inputs.quiet_datasets():  # SFTTrainer prepares the rows through `datasets.map`, a bar each
        trainer = task.trainer(
            model=student, args=args, train_dataset=data.train, eval_dataset=data.eval, data_collator=data.collate,
            processing_class=tokenizer, objective=objective, scores=task.scores, eval_collator=data.eval_collate,
            tables=lambda model, scores: task.tables(model, scores, recipe, data, tokenizer),
            held_out_loss=lambda tables: task.held_out_loss(recipe, tables))
    if len(trainer.train_dataset) < recipe.global_batch(world):
        raise PosEncError(f"{recipe.source}: the batch of {recipe.global_batch(world)} sequences a step (global_batch_size"
                          f", or per_device_train_batch_size x gradient_accumulation_steps x {world} process(es)) is "
                          f"more than the {len(trainer.train_dataset)} training samples")
    scored = recipe.posenc.eval_original and recipe.posenc.scheme and task.original and latest is None
    callback = RecoveryCallback(  # the model before the swap is scored once training prepared the student
        trainer, recipe.data.seq_len, recipe.posenc.eval_after, reference=before_swap if scored else None,
        on_original=lambda tables: joined.is_main_process and _write_run_file(recipe, trainer, latest, teacher, tables))
    del before_swap
    trainer.add_callback(stop)
    trainer.add_callback(callback)  # after `stop`: it snapshots for a checkpoint that `stop` asks for too
    if not args.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(LabelledProgress(trainer))
    original = None
    if latest is not None:
        state = json.loads((latest / STATE_FILE).read_text())
        saved = state["stateful_callbacks"][RecoveryCallback.__name__]["attributes"]
        if len(saved["samples"]) != world:
            raise PosEncError(f"{latest} was written by {len(saved['samples'])} process(es); resume it with as "
                              f"many, not {world}")
        callback.restore(saved)
        original = callback.original = json.loads((out / RUN_FILE).read_text()).get("original")
    if joined.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        _write_run_file(recipe, trainer, latest, teacher, original)
    joined.wait_for_everyone()
    return Session(recipe, trainer, callback, record, tokenizer, task, data, latest)


def _fsdp(recipe: Recipe, launched: DistributedType) -> bool:
    """Whether the launch shards the model (FSDP), refusing a distillation that FSDP1 cannot shard a teacher for."""
    if launched != DistributedType.FSDP:
        return False
    plugin = AcceleratorState._shared_state.get("fsdp_plugin")  # a state made before the run, else the launch's
    version = plugin.fsdp_version if plugin is not None else int(os.environ.get("FSDP_VERSION", "1"))
    if version != 2 and recipe.posenc.objective != "lm":
        raise PosEncError(f"{recipe.source}: objective: {recipe.posenc.objective!r} needs FSDP2 to shard "
                          "its teacher; set fsdp_version: 2 in the accelerate config (as the shipped 'fsdp' one does), "
                          "use DDP (--accelerate-config ddp), or 'lm'")
    return True


def _report_teacher(cloned_mib: float, fsdp: bool, world: int, main: bool) -> None:
    if main and fsdp:
        print(f"distillation teacher: the model before the swap, its own frozen copy sharded like the student "
              f"(FSDP2): {cloned_mib:.1f} MiB in all, about {cloned_mib / world:.1f} MiB per process", flush=True)
    elif main:
        print(f"distillation teacher: the model before the swap, sharing the student's frozen weights (peft trains "
              f"copies of what trains in full); {cloned_mib:.1f} MiB cloned", flush=True)


def _write_run_file(recipe: Recipe, trainer: PositionalPieces, latest: Path | None,
                    teacher: objectives.Teacher | None, original: dict[str, Any] | None) -> None:
    """Mark the folder unfinished until `_finish` (so that --overwrite may replace this run later, and nothing else;
    a rerun may start it over while it has no checkpoint: `run_folder.check_output`) and write run.json."""
    out, accelerator = Path(recipe.training.output_dir), trainer.accelerator
    folders.mark(out, "train", [recipe.source, recipe.model.model_name_or_path], complete=False)
    write_json(out / RUN_FILE, {
        "recipe": recipe.to_dict(), "source": recipe.source, "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type), "backend": accelerator.state.backend,
        "host": socket.gethostname(), "threads": torch.get_num_threads(),
        "trainer": next(c.__name__ for c in type(trainer).__mro__ if c.__module__.startswith(("transformers", "trl"))),
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "total_parameters": sum(p.numel() for p in trainer.model.parameters()),
        "resumed_from": str(latest) if latest else None,
        "teacher_frozen_bytes": teacher.frozen_bytes if teacher is not None else None,
        "original": original,
    })


# ---------------------------------------------------------------- finish
def _finish(run: Session) -> results.Results:
    """Score the trained model, write results.json, loss.json, the plots and the model; mark the folder finished."""
    recipe, trainer = run.recipe, run.trainer
    accelerator = trainer.accelerator
    after = run.callback.after if recipe.posenc.eval_after else None
    if after is not None and trainer.args.load_best_model_at_end:  # Trainer loaded the best after the last step
        trainer.evaluate(metric_key_prefix="eval_best", why="the best checkpoint (after training)")
        after = trainer.tables
    measured = run.callback.snapshot()
    log = [{"step": row["step"], "loss": row["loss"], "lr": row.get("learning_rate"),
            **{k: row[k] for k in ("grad_norm", "tokens_per_s", "elapsed_s", "cpu_s") if k in row}}
           for row in trainer.state.log_history if "loss" in row]
    record = _record(run, after, measured)
    if accelerator.is_main_process:
        write_json(run.out / "loss.json", log)
        record.save(run.out / "results.json", complete=True)
        if recipe.posenc.plot:
            _plot(run, log)
    if recipe.posenc.save_model:
        weights = accelerator.get_state_dict(trainer.model_wrapped)  # collective: gathers FSDP shards, every rank
        if accelerator.is_main_process:
            modeling.save_model(accelerator.unwrap_model(trainer.model_wrapped), run.tokenizer, recipe, run.out,
                                weights, sharded=trainer.is_fsdp_enabled)
    if accelerator.is_main_process:
        folders.finished(run.out)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return record


def _record(run: Session, after: dict[str, Any] | None, measured: dict[str, Any]) -> results.Results:
    """The run's results: what trained where, and the runs original / before / after training."""
    recipe, record, trainer = run.recipe, run.record, run.trainer
    wall = measured["clock"][0]
    record.details = {
        "steps": trainer.state.global_step, "world_size": trainer.accelerator.num_processes,
        "samples_per_rank": measured["samples"], "tokens_per_rank": measured["tokens"], "train_seconds": wall,
        "tokens_per_s": sum(measured["tokens"]) / wall if wall else None,
        **({"curve": measured["curve"]} if trainer.args.eval_strategy != "no" and measured["curve"] else {}),
    }
    unwrapped = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    swapped = {"scheme": recipe.posenc.scheme, "options": dict(recipe.posenc.scheme_options),
               "posenc": getattr(unwrapped.config, "posenc", None) if describe(unwrapped) else None}
    record.runs = [results.Run(label, **(swapped if label != "original" else {}), metrics=metrics)
                   for label, metrics in (("original", measured["original"]), ("before training", measured["before"]),
                                          ("after training", after)) if metrics is not None]
    record.suites = {held_out.NAME: held_out.section(record)}  # the tables described, as eval's are
    return record


def _plot(run: Session, log: list[dict[str, Any]]) -> None:
    """loss.png (with the held-out losses as points and reference), and curve.png when there is a curve."""
    recipe, steps, points = run.recipe, run.trainer.state.global_step, run.callback.curve
    losses = {r.label: run.task.held_out_loss(recipe, r.metrics) for r in run.record.runs}
    plots.loss_curve(
        log, run.out / "loss.png",
        reference=("eval, before the swap", losses["original"]) if "original" in losses else None,
        points=[(f"eval {label}", step, losses[label])
                for label, step in (("before training", 0), ("after training", steps)) if label in losses],
        curve=points)
    if points:
        after = next((r.metrics for r in run.record.runs if r.label == "after training"), {})
        text = f"up to {recipe.data.max_eval_samples} held-out windows of {Path(recipe.data.dataset_name).name}"
        original = run.callback.original
        plots.recovery_curve(points, run.out / "curve.png", seq_len=recipe.data.seq_len, held_out=text,
                             reference=held_out.perplexity_by_length(original) if original else None,
                             final=(steps, held_out.perplexity_by_length(after)))
