"""A training run in three parts, setup -> loop -> finish, under one Accelerator: from 1 CPU process to
N GPUs, resumable after a crash. What may be written where, and the checkpoints, are `run_folder`'s."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from .. import folders, plots, results
from ..errors import PosEncError
from ..evaluation import processes
from ..patching import describe
from ..progress import bar, waiting
from ..results import write_json
from . import curve, inputs, modeling, objectives, scope, tasks
from .recipe import Recipe
from .run_folder import RUN_FILE, STATE_FILE, Checked, TrainerState, checkpoints, preflight, save_checkpoint


def _evaluate(model: torch.nn.Module, loader: Any, accelerator: Accelerator, recipe: Recipe,
              data: inputs.Prepared, tokenizer: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Metric tables (see `hf_posenc.results`) of the held-out data, sharded over processes: the task's
    per-sample scores, gathered, then its tables (`tasks.TRAINING_TASKS`). Under the training's autocast, which
    the model before the swap (not yet prepared) would otherwise run without: another model than the one trained."""
    task = tasks.TRAINING_TASKS[recipe.model.task]
    model.eval()
    gathered: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), accelerator.autocast():
        for batch in bar(loader, desc="held-out evaluation", unit="batch", show=accelerator.is_main_process):
            for name, values in task.scores(model, batch).items():
                gathered.setdefault(name, []).append(accelerator.gather_for_metrics(values))
        scores = {name: torch.cat(values) for name, values in gathered.items()}
        # every rank calls the suites alike and scores its share (as many forwards each: FSDP's are collective)
        metrics = task.tables(accelerator.unwrap_model(model), scores, recipe, data, tokenizer)
    model.train()
    return metrics


def _adamw(groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
    """Fused AdamW where torch has the kernel for the device (the Trainer's default too), else foreach."""
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except RuntimeError:
        return torch.optim.AdamW(groups, lr=lr)


def train(recipe: Recipe, resume: bool | str = False, overwrite: bool = False,
          checked: Checked | None = None) -> results.Results:
    """Run a recipe under whatever `accelerate launch` set up; returns what it wrote to results.json:
    the runs "original" (LM only), "before training" and "after training", as `evaluation` sets allow.

    Args:
        recipe: a validated Recipe (see `load_recipe`).
        resume: continue from the latest checkpoint in `output.dir` (True: there must be one;
            "auto": if there is one).
        overwrite: replace the run in `output.dir`.
        checked: what `preflight` found, when the caller ran it (then `resume` and `overwrite` are unused);
            else it runs here.
    """
    with scope.run_only():  # `training.deterministic` and `training.mixed_precision` hold for this run only
        run = _setup(recipe, resume, overwrite, checked)
        _loop(run)
        return _finish(run)


@dataclasses.dataclass
class Session:
    """A run's live parts, made by `_setup` and shared by `_loop` and `_finish`."""

    recipe: Recipe
    accelerator: Accelerator
    record: results.Results
    model: Any
    tokenizer: Any
    task: tasks.Task
    data: inputs.Prepared
    eval_loader: Any
    loader: Any = None
    sampler: inputs.EpochSampler | None = None
    optimizer: Any = None
    scheduler: Any = None
    objective: objectives.Objective | None = None
    trainable: int = 0  # parameters trained, counted before `prepare` wraps or shards them
    state: TrainerState = dataclasses.field(default_factory=TrainerState)

    @property
    def out(self) -> Path:
        return Path(self.recipe.output.dir)

    def evaluate(self) -> dict[str, dict[str, dict[str, Any]]]:
        return _evaluate(self.model, self.eval_loader, self.accelerator, self.recipe, self.data, self.tokenizer)

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the processes (collective), back on the CPU."""
        return self.accelerator.reduce(values.to(self.accelerator.device), "sum").cpu()

    def gather_counts(self, samples: int, tokens: int) -> None:
        """Every rank's sample and token counts into the state (collective): the proof of who trained."""
        counts = self.accelerator.gather(torch.tensor([[samples, tokens]], device=self.accelerator.device)).cpu()
        self.state.samples, self.state.tokens = counts[:, 0].tolist(), counts[:, 1].tolist()


# ---------------------------------------------------------------- setup
def _setup(recipe: Recipe, resume: bool | str, overwrite: bool, checked: Checked | None) -> Session:
    """Preflight (unless done), the Accelerator, model, data and optimizer, restored from the latest
    checkpoint when resuming; the run folder marked and run.json written; the model scored before training."""
    t, out = recipe.training, Path(recipe.output.dir)
    joined = processes.join()  # torchrun without an accelerator means N CPU processes over gloo; Accelerator reuses it
    world = joined.num_processes
    raw, resume, overwrite = checked or preflight(recipe, resume, overwrite, world)  # before any compute
    record = results.Results("train", recipe.model.name_or_path, settings=recipe.to_dict())  # its clock starts
    accelerator = _accelerator(recipe, cpu=joined.device.type == "cpu", world=world)
    if overwrite and accelerator.is_main_process and (out / RUN_FILE).is_file():
        shutil.rmtree(out)
    accelerator.wait_for_everyone()
    latest = checkpoints(out)[-1] if resume and checkpoints(out) else None

    set_seed(t.seed)
    if t.deterministic:
        scope.deterministic()
    with waiting(f"loading {recipe.model.name_or_path} and preparing the data ({recipe.data.dataset})",
                 show=accelerator.is_main_process):
        run = _model_and_data(recipe, accelerator, record, inputs.load_raw(recipe) if raw is None else raw)
    original = None  # a classifier's head is untrained before the run: nothing to compare with
    if recipe.evaluation.original and recipe.posenc.scheme and run.task.original and latest is None:
        run.model.to(accelerator.device)
        original = run.evaluate()
    teacher = _swap_and_optimize(run)
    run.state = TrainerState(samples=[0] * world, tokens=[0] * world, original=original)
    if latest is not None:
        run.state = TrainerState(**json.loads((latest / STATE_FILE).read_text()))
        if len(run.state.samples) != world:
            raise PosEncError(f"{latest} was written by {len(run.state.samples)} process(es); resume it with as "
                              f"many, not {world}")
        accelerator.load_state(str(latest))
    elif accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    if accelerator.is_main_process:
        _write_run_file(run, latest, teacher)
    accelerator.wait_for_everyone()
    if recipe.evaluation.before and run.state.before is None:
        run.state.before = run.evaluate()
    if recipe.evaluation.every_steps and not run.state.curve and run.state.before is not None:
        run.state.curve.append(curve.point(0, 0, 0.0, 0.0, run.state.before, recipe.data.seq_len))
    return run


def _accelerator(recipe: Recipe, cpu: bool, world: int) -> Accelerator:
    """The run's Accelerator: its gradient accumulation keeps the global batch whatever the process count."""
    t = recipe.training
    accelerator = Accelerator(
        cpu=cpu, mixed_precision=t.mixed_precision, rng_types=[], step_scheduler_with_optimizer=False,
        gradient_accumulation_steps=t.batch_size // (t.micro_batch_size * world),
    )
    if _fsdp(accelerator) and not accelerator.is_fsdp2 and t.objective != "lm":
        raise PosEncError(f"{recipe.source}: training.objective: {t.objective!r} needs FSDP2 to shard its "
                          "teacher; set fsdp_version: 2 in the accelerate config (as the shipped 'fsdp' one does), "
                          "use DDP (--accelerate-config ddp), or 'lm'")
    return accelerator


def _fsdp(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.FSDP


def _model_and_data(recipe: Recipe, accelerator: Accelerator, record: results.Results,
                    raw: datasets.DatasetDict) -> Session:
    """The model before the swap, its tokenizer, the task's rows and the held-out loader."""
    model, tokenizer = modeling.load_recipe_model(recipe)
    task = tasks.TRAINING_TASKS[recipe.model.task]
    data = task.prepare(recipe, raw, tokenizer)
    eval_loader = accelerator.prepare(torch.utils.data.DataLoader(
        data.eval, recipe.evaluation.micro_batch_size, collate_fn=data.collate,
        generator=torch.Generator().manual_seed(recipe.training.seed)))
    return Session(recipe, accelerator, record, model, tokenizer, task, data, eval_loader)


def _swap_and_optimize(run: Session) -> objectives.Teacher | None:
    """Swap the scheme in, choose what trains, and prepare model, optimizer, loader and scheduler;
    returns the distillation teacher (the model before the swap), if the objective has one."""
    recipe, accelerator, t = run.recipe, run.accelerator, run.recipe.training
    run.objective, teacher = objectives.build(recipe, run.model, _fsdp(accelerator))
    posenc_names = modeling.apply_posenc(run.model, recipe)
    if t.gradient_checkpointing:
        run.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = modeling.select_trainable(run.model, recipe, posenc_names)
    if teacher is not None:
        _report_teacher(teacher.freeze_trained() / 2**20, accelerator)
    run.sampler = inputs.EpochSampler(len(run.data.train), t.batch_size, t.seed)
    if run.sampler.steps_per_epoch == 0:
        raise PosEncError(f"{recipe.source}: training.batch_size: {t.batch_size} is more than the "
                          f"{len(run.data.train)} training samples")
    # Own generators: a DataLoader draws a seed from the global RNG on every pass, which would shift
    # the dropout stream of a resumed run (its pass over the data starts after the restore).
    loader = torch.utils.data.DataLoader(run.data.train, t.micro_batch_size, sampler=run.sampler,
                                         collate_fn=run.data.collate, generator=torch.Generator().manual_seed(t.seed))
    params = [p for p in model.parameters() if p.requires_grad]
    run.trainable = sum(p.numel() for p in params)
    optimizer = _adamw(  # no decay on biases and norm gains (the usual GPT recipe)
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": t.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=t.lr)
    from transformers import get_scheduler

    scheduler = get_scheduler("constant_with_warmup" if t.scheduler == "constant" else t.scheduler, optimizer,
                              num_warmup_steps=t.warmup_steps, num_training_steps=t.max_steps)
    run.model, run.optimizer, run.loader, run.scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if teacher is not None:  # sharded like the student under FSDP2, else its clones follow it to the device
        teacher.place(accelerator)
    return teacher


def _report_teacher(cloned_mib: float, accelerator: Accelerator) -> None:
    if accelerator.is_main_process and _fsdp(accelerator):
        print(f"distillation teacher: the model before the swap, its own frozen copy sharded like the student "
              f"(FSDP2): {cloned_mib:.1f} MiB in all, about {cloned_mib / accelerator.num_processes:.1f} MiB per "
              "process", flush=True)
    elif accelerator.is_main_process:
        print(f"distillation teacher: the model before the swap, sharing the student's frozen weights; "
              f"{cloned_mib:.1f} MiB cloned for the parameters trained in full", flush=True)


def _write_run_file(run: Session, latest: Path | None, teacher: objectives.Teacher | None) -> None:
    """Mark the folder (so that --overwrite may replace this run later, and nothing else) and write run.json."""
    recipe, accelerator = run.recipe, run.accelerator
    if not folders.is_marked(run.out):
        folders.mark(run.out, "train", [recipe.source, recipe.model.name_or_path])
    write_json(run.out / RUN_FILE, {
        "recipe": recipe.to_dict(), "source": recipe.source, "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type), "backend": accelerator.state.backend,
        "host": socket.gethostname(),
        "trainable_parameters": run.trainable,
        "total_parameters": sum(p.numel() for p in accelerator.unwrap_model(run.model).parameters()),
        "resumed_from": str(latest) if latest else None,
        "teacher_frozen_bytes": teacher.frozen_bytes if teacher is not None else None,
    })


# ---------------------------------------------------------------- loop
@dataclasses.dataclass
class Meter:
    """The loop's running measures: loss sum, micro-batches and tokens since the last log (float64 on the CPU,
    summed over processes as fp32 on the device: MPS has no float64), and this rank's samples and tokens."""

    clock: curve.Clock
    shown: Any
    samples: int
    tokens: int
    window: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(3, dtype=torch.float64))
    tick: float = dataclasses.field(default_factory=time.perf_counter)
    cpu0: float = dataclasses.field(default_factory=time.process_time)


def _loop(run: Session) -> None:
    """Optimizer steps until training.max_steps, with logging, curve points and checkpoints between them."""
    t, accelerator, state = run.recipe.training, run.accelerator, run.state
    rank = accelerator.process_index
    shown = bar(total=t.max_steps, initial=state.step, show=accelerator.is_main_process, desc="train", unit="step")
    meter = Meter(curve.Clock(*state.clock), shown, state.samples[rank], state.tokens[rank])
    run.model.train()
    while state.step < t.max_steps:
        run.sampler.set_position(state.epoch, state.offset)
        for batch in run.loader:
            _micro_step(run, batch, meter)
            if not accelerator.sync_gradients:
                continue
            run.scheduler.step()
            state.step, state.offset = state.step + 1, state.offset + t.batch_size
            shown.update(1)
            _between_steps(run, meter)
            if state.step >= t.max_steps:
                break
        else:
            state.epoch, state.offset = state.epoch + 1, 0
    shown.close()
    run.gather_counts(meter.samples, meter.tokens)


def _micro_step(run: Session, batch: dict[str, torch.Tensor], meter: Meter) -> None:
    """Forward and backward of one micro-batch; the optimizer steps when accumulation is complete."""
    t, accelerator, model = run.recipe.training, run.accelerator, run.model
    with accelerator.accumulate(model):
        loss = run.objective(model, batch)
        accelerator.backward(loss)
        if accelerator.sync_gradients and t.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    mask = batch.get("attention_mask")  # a PoSE row of several documents has a 4-D one
    n_tok = int(mask.sum()) if mask is not None and mask.ndim == 2 else batch["input_ids"].numel()
    meter.window += torch.tensor([loss.item(), 1.0, n_tok], dtype=torch.float64)
    meter.samples, meter.tokens = meter.samples + batch["input_ids"].shape[0], meter.tokens + n_tok


def _between_steps(run: Session, meter: Meter) -> None:
    """After an optimizer step: the loss log, a recovery-curve point, a checkpoint, as the recipe asks."""
    t, state, every = run.recipe.training, run.state, run.recipe.evaluation.every_steps
    if state.step % t.logging_steps == 0 or state.step == t.max_steps:
        _log(run, meter)
    if every and state.step % every == 0:
        wall, cpu = meter.clock.totals(run.summed)
        n = int(run.summed(torch.tensor([meter.tokens])).item())
        state.curve.append(curve.point(state.step, n, wall, cpu, run.evaluate(), run.recipe.data.seq_len))
        meter.clock.resume()
        meter.tick = time.perf_counter()
    if t.save_steps and state.step % t.save_steps == 0 and state.step < t.max_steps:
        state.clock = list(meter.clock.totals(run.summed))
        run.gather_counts(meter.samples, meter.tokens)
        save_checkpoint(run.accelerator, run.out, state, t.save_total_limit)
        meter.clock.resume()
        meter.tick = time.perf_counter()


def _log(run: Session, meter: Meter) -> None:
    """One row of loss.json: the mean loss, learning rate and throughput since the last row."""
    state = run.state
    total = run.summed(meter.window.float()).double()
    seconds = time.perf_counter() - meter.tick
    state.train_seconds += seconds
    row = {"step": state.step, "loss": total[0].item() / total[1].item(),
           "lr": run.scheduler.get_last_lr()[0], "tokens_per_s": total[2].item() / seconds,
           "elapsed_s": state.train_seconds,
           "cpu_s": time.process_time() - meter.cpu0}  # this session's process CPU time: robust to a busy machine
    state.log.append(row)
    meter.shown.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_s']:.0f}")
    meter.window.zero_()
    meter.tick = time.perf_counter()


# ---------------------------------------------------------------- finish
def _finish(run: Session) -> results.Results:
    """Score the trained model, write results.json, loss.json, the plots and the model; end the run."""
    recipe, accelerator = run.recipe, run.accelerator
    after = run.evaluate() if recipe.evaluation.after else None
    accelerator.wait_for_everyone()
    record = _record(run, after)
    if accelerator.is_main_process:
        write_json(run.out / "loss.json", run.state.log)
        record.save(run.out / "results.json", complete=True)
        if recipe.output.plot:
            _plot(run)
    if recipe.output.save_model:
        weights = accelerator.get_state_dict(run.model)  # collective: gathers FSDP shards, on every rank
        if accelerator.is_main_process:
            modeling.save_model(accelerator.unwrap_model(run.model), run.tokenizer, recipe, run.out, weights,
                                sharded=_fsdp(accelerator))
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return record


def _record(run: Session, after: dict[str, Any] | None) -> results.Results:
    """The run's results: what trained where, and the runs original / before / after training."""
    recipe, state, record = run.recipe, run.state, run.record
    record.details = {
        "steps": state.step, "world_size": run.accelerator.num_processes, "samples_per_rank": state.samples,
        "tokens_per_rank": state.tokens, "train_seconds": state.train_seconds,
        "tokens_per_s": sum(state.tokens) / state.train_seconds if state.train_seconds else None,
        **({"curve": state.curve} if recipe.evaluation.every_steps else {}),
    }
    unwrapped = run.accelerator.unwrap_model(run.model)
    swapped = {"scheme": recipe.posenc.scheme, "options": dict(recipe.posenc.options),
               "posenc": getattr(unwrapped.config, "posenc", None) if describe(unwrapped) else None}
    record.runs = [results.Run(label, **(swapped if label != "original" else {}), metrics=metrics)
                   for label, metrics in (("original", state.original), ("before training", state.before),
                                          ("after training", after)) if metrics is not None]
    return record


def _plot(run: Session) -> None:
    """loss.png (with the held-out losses as points and reference), and curve.png when there is a curve."""
    recipe, state = run.recipe, run.state
    losses = {r.label: run.task.held_out_loss(recipe, r.metrics) for r in run.record.runs}
    plots.loss_curve(
        state.log, run.out / "loss.png",
        reference=("eval, before the swap", losses["original"]) if "original" in losses else None,
        points=[(f"eval {label}", step, losses[label])
                for label, step in (("before training", 0), ("after training", state.step)) if label in losses],
        curve=state.curve)
    if state.curve:
        after = next((r.metrics.get("perplexity", {}) for r in run.record.runs if r.label == "after training"), {})
        held_out = f"up to {recipe.data.max_eval_samples} held-out windows of {Path(recipe.data.dataset).name}"
        plots.recovery_curve(state.curve, run.out / "curve.png", reference=state.original, seq_len=recipe.data.seq_len,
                             held_out=held_out, final=(state.step, {n: c["perplexity"] for n, c in after.items()}))
