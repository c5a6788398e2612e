"""The training loop: one Accelerator, from 1 CPU process to N GPUs, resumable after a crash."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, NamedTuple

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from .. import folders, plots, results
from ..progress import bar
from ..errors import PosEncError
from ..evaluation import processes
from ..patching import describe
from ..results import write_json
from . import curve, inputs, modeling, objectives, tasks
from .recipe import Recipe

RUN_FILE = "run.json"
STATE_FILE = "trainer_state.json"
CHECKPOINTS = "checkpoints"
CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"  # what deterministic cuBLAS needs (CUDA docs, "Reproducibility")
# Fields that may change between a run and its resume; anything else means a different run.
RESUMABLE_CHANGES = {"training.max_steps", "training.save_steps", "training.save_total_limit",
                     "training.logging_steps", "evaluation", "output"}


@dataclasses.dataclass
class TrainerState:
    """Everything besides model/optimizer/scheduler/RNG (saved by accelerate) that a resume needs."""

    step: int = 0
    epoch: int = 0
    offset: int = 0  # samples of this epoch already consumed (all processes together)
    samples: list[int] = dataclasses.field(default_factory=list)  # per rank, for the proof of who trained
    tokens: list[int] = dataclasses.field(default_factory=list)
    log: list[dict[str, float]] = dataclasses.field(default_factory=list)
    original: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    train_seconds: float = 0.0
    clock: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0])  # training wall, CPU s (curve.Clock)
    curve: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # evaluation.every_steps points


def checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints, oldest first. Temp dirs of an interrupted save are never listed."""
    root = out / CHECKPOINTS
    found = [p for p in root.glob("checkpoint-*") if (p / STATE_FILE).is_file()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def _diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    keys = []
    for section in sorted(set(a) | set(b)):
        for name in sorted(set(a.get(section, {})) | set(b.get(section, {}))):
            if a.get(section, {}).get(name) != b.get(section, {}).get(name):
                if section not in RESUMABLE_CHANGES and f"{section}.{name}" not in RESUMABLE_CHANGES:
                    keys.append(f"{section}.{name}")
    return keys


def check_output(recipe: Recipe, resume: bool | str, overwrite: bool) -> tuple[bool, bool]:
    """Refuse to write into a folder that holds another run unless told to resume or overwrite.
    `resume` is True (continue from the latest checkpoint, which must exist) or "auto" (continue if
    there is a checkpoint, else start over); returns the (resume, overwrite) this run does."""
    out = Path(recipe.output.dir)
    where = f"{recipe.source}: output.dir"
    if resume and overwrite:
        raise PosEncError("--resume and --overwrite exclude each other")
    folders.check_separate(out, input_paths(recipe), flag=where)
    if out.is_file():
        raise PosEncError(f"{where}: {str(out)!r} is a file; give a folder (new or empty)")
    if resume == "auto":
        if checkpoints(out):
            resume = True
        else:  # start over: allowed over this same run, which saved nothing to continue from
            resume, overwrite = False, ((out / RUN_FILE).is_file() and folders.is_marked(out)
                                        and not _recipe_changes(out, recipe))
    elif resume and not checkpoints(out):
        raise PosEncError(f"{where}: --resume: {str(out)!r} has no checkpoint to continue from; run without "
                          "--resume to start, or pass --resume auto to start when there is none")
    if not out.exists() or not any(out.iterdir()):
        return bool(resume), overwrite
    if not (out / RUN_FILE).is_file():
        raise PosEncError(f"{where}: {str(out)!r} is not empty and holds no hf-posenc run; choose a new or empty folder")
    if overwrite:
        if not folders.is_marked(out):
            raise PosEncError(f"{where}: --overwrite: {str(out)!r} has no {folders.MARKER} marker, so this "
                              f"hf-posenc did not write it (an older version may have): {folders.ASK}")
        return False, True
    if not resume:
        raise PosEncError(f"{where}: {str(out)!r} already holds a run; pass --resume to continue it or --overwrite to replace it")
    if changed := _recipe_changes(out, recipe):
        raise PosEncError(f"{where}: cannot resume {str(out)!r}: the recipe changed in {', '.join(changed)}")
    return True, False


def input_paths(recipe: Recipe) -> dict[str, str | None]:
    """What the run reads, by recipe field (built-in dataset names are no paths)."""
    data = None if recipe.data.dataset in inputs.BUILTIN else recipe.data.dataset
    return {"model.name_or_path": recipe.model.name_or_path, "model.tokenizer": recipe.model.tokenizer,
            "data.dataset": data, "the recipe": recipe.source}


def _recipe_changes(out: Path, recipe: Recipe) -> list[str]:
    return _diff(json.loads((out / RUN_FILE).read_text())["recipe"], recipe.to_dict())


class Checked(NamedTuple):
    """What `preflight` found, for `train` to start from: the raw data (None: load it at setup, as a
    process launched after the checks does) and the resume and overwrite the run does, settled."""

    raw: datasets.DatasetDict | None
    resume: bool
    overwrite: bool


def preflight(recipe: Recipe, resume: bool | str, overwrite: bool, world_size: int) -> Checked:
    """Every check that needs no compute: output folder, scheme support, dataset columns, batch split.
    Run once per run, before any process starts; returns the raw data and the (resume, overwrite) the run
    does (see `check_output`)."""
    t = recipe.training
    if t.batch_size % (t.micro_batch_size * world_size):
        fits = [m for m in range(t.micro_batch_size, 0, -1) if t.batch_size % (m * world_size) == 0]
        fix = f"--training.micro_batch_size {fits[0]}" if fits else f"a training.batch_size that is a multiple of {world_size}"
        raise PosEncError(
            f"{recipe.source}: training.batch_size: {t.batch_size} does not split into micro-batches of "
            f"{t.micro_batch_size} on {world_size} process(es); use {fix}"
        )
    resume, overwrite = check_output(recipe, resume, overwrite)
    config = modeling.load_config(recipe)
    tasks.check_model(recipe, config)
    modeling.check_scheme(recipe, config)
    return Checked(inputs.load_raw(recipe), resume, overwrite)


def _evaluate(model: torch.nn.Module, loader: Any, accelerator: Accelerator, recipe: Recipe,
              data: inputs.Prepared, tokenizer: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Metric tables (see `hf_posenc.results`) of the held-out data, sharded over processes: the task's
    per-sample scores, gathered, then its tables (`tasks.TASKS`). Under the training's autocast, which the model
    before the swap (not yet prepared) would otherwise run without: another model than the one trained."""
    task = tasks.TASKS[recipe.model.task]
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


def _save_checkpoint(accelerator: Accelerator, out: Path, state: TrainerState, keep: int) -> None:
    """accelerate.save_state into a temp folder, then rename: a crash leaves the last good one intact."""
    root = out / CHECKPOINTS
    name = f"checkpoint-{state.step}"
    tmp, final = root / f".tmp-{name}", root / name
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    tmp.mkdir(parents=True, exist_ok=True)
    accelerator.save_state(str(tmp))  # model, optimizer, scheduler, and one RNG file per process
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(dataclasses.asdict(state), indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        old = checkpoints(out)
        for path in old[: max(0, len(old) - keep)] if keep else []:
            doomed = path.with_name(f".tmp-delete-{path.name}")
            os.replace(path, doomed)  # stops being a checkpoint before its files go
            shutil.rmtree(doomed)
    accelerator.wait_for_everyone()


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
    before, workspace = torch.are_deterministic_algorithms_enabled(), os.environ.get(CUBLAS_WORKSPACE)
    try:  # `training.deterministic` holds for this run only, not for the rest of the caller's process
        return _train(recipe, resume, overwrite, checked)
    finally:
        torch.use_deterministic_algorithms(before)
        if workspace is None:
            os.environ.pop(CUBLAS_WORKSPACE, None)


def _train(recipe: Recipe, resume: bool | str, overwrite: bool, checked: Checked | None) -> results.Results:
    t, out = recipe.training, Path(recipe.output.dir)
    joined = processes.join()  # torchrun without an accelerator means N CPU processes over gloo; Accelerator reuses it
    cpu, world = joined.device.type == "cpu", joined.num_processes
    raw, resume, overwrite = checked or preflight(recipe, resume, overwrite, world)  # before any compute
    raw = inputs.load_raw(recipe) if raw is None else raw
    record = results.Results("train", recipe.model.name_or_path, settings=recipe.to_dict())
    accelerator = Accelerator(
        cpu=cpu, mixed_precision=t.mixed_precision, rng_types=[], step_scheduler_with_optimizer=False,
        gradient_accumulation_steps=t.batch_size // (t.micro_batch_size * world),
    )
    main, fsdp = accelerator.is_main_process, accelerator.distributed_type == DistributedType.FSDP
    if fsdp and not accelerator.is_fsdp2 and recipe.training.objective != "lm":
        raise PosEncError(f"{recipe.source}: training.objective: {recipe.training.objective!r} needs FSDP2 to shard its "
                          "teacher; set fsdp_version: 2 in the accelerate config (as the shipped 'fsdp' one does), "
                          "use DDP (--accelerate-config ddp), or 'lm'")
    if overwrite and main and (out / RUN_FILE).is_file():
        shutil.rmtree(out)
    accelerator.wait_for_everyone()
    latest = checkpoints(out)[-1] if resume and checkpoints(out) else None

    set_seed(t.seed)
    if t.deterministic:
        os.environ.setdefault(CUBLAS_WORKSPACE, ":4096:8")  # else cuBLAS matmuls raise under deterministic algorithms
        torch.use_deterministic_algorithms(True)
    model, tokenizer = modeling.load_recipe_model(recipe)
    task = tasks.TASKS[recipe.model.task]
    data = task.prepare(recipe, raw, tokenizer)
    eval_loader = accelerator.prepare(torch.utils.data.DataLoader(
        data.eval, recipe.evaluation.micro_batch_size, collate_fn=data.collate,
        generator=torch.Generator().manual_seed(t.seed)))
    original = None  # a classifier's head is untrained before the run: nothing to compare with
    if recipe.evaluation.original and recipe.posenc.scheme and task.original and latest is None:
        original = _evaluate(model.to(accelerator.device), eval_loader, accelerator, recipe, data, tokenizer)
    objective, teacher = objectives.build(recipe, model, fsdp)  # the teacher is the model before the swap
    posenc_names = modeling.apply_posenc(model, recipe)
    if t.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = modeling.select_trainable(model, recipe, posenc_names)
    if teacher is not None:
        cloned = teacher.freeze_trained() / 2**20
        if main and fsdp:
            print(f"distillation teacher: the model before the swap, its own frozen copy sharded like the student "
                  f"(FSDP2): {cloned:.1f} MiB in all, about {cloned / world:.1f} MiB per process", flush=True)
        elif main:
            print(f"distillation teacher: the model before the swap, sharing the student's frozen weights; "
                  f"{cloned:.1f} MiB cloned for the parameters trained in full", flush=True)

    sampler = inputs.EpochSampler(len(data.train), t.batch_size, t.seed)
    if sampler.steps_per_epoch == 0:
        raise PosEncError(f"{recipe.source}: training.batch_size: {t.batch_size} is more than the "
                          f"{len(data.train)} training samples")
    # Own generators: a DataLoader draws a seed from the global RNG on every pass, which would shift
    # the dropout stream of a resumed run (its pass over the data starts after the restore).
    loader = torch.utils.data.DataLoader(data.train, t.micro_batch_size, sampler=sampler, collate_fn=data.collate,
                                         generator=torch.Generator().manual_seed(t.seed))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _adamw(  # no decay on biases and norm gains (the usual GPT recipe)
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": t.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=t.lr)
    from transformers import get_scheduler

    scheduler = get_scheduler("constant_with_warmup" if t.scheduler == "constant" else t.scheduler, optimizer,
                              num_warmup_steps=t.warmup_steps, num_training_steps=t.max_steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if teacher is not None:  # sharded like the student under FSDP2, else its clones follow it to the device
        teacher.place(accelerator)

    rank, n_trainable = accelerator.process_index, sum(p.numel() for p in params)
    state = TrainerState(samples=[0] * world, tokens=[0] * world, original=original)
    if latest is not None:
        state = TrainerState(**json.loads((latest / STATE_FILE).read_text()))
        if len(state.samples) != world:
            raise PosEncError(f"{latest} was written by {len(state.samples)} process(es); resume it with as many, not {world}")
        accelerator.load_state(str(latest))
    elif main:
        out.mkdir(parents=True, exist_ok=True)
    if main:
        if not folders.is_marked(out):  # so that --overwrite may replace this run later, and nothing else
            folders.mark(out, "train", [recipe.source, recipe.model.name_or_path])
        write_json(out / RUN_FILE, {
            "recipe": recipe.to_dict(), "source": recipe.source, "world_size": world,
            "distributed_type": str(accelerator.distributed_type), "backend": accelerator.state.backend,
            "host": socket.gethostname(), "trainable_parameters": n_trainable,
            "total_parameters": sum(p.numel() for p in accelerator.unwrap_model(model).parameters()),
            "resumed_from": str(latest) if latest else None,
            "teacher_frozen_bytes": teacher.frozen_bytes if teacher is not None else None,
        })
    accelerator.wait_for_everyone()

    if recipe.evaluation.before and state.before is None:
        state.before = _evaluate(model, eval_loader, accelerator, recipe, data, tokenizer)
    every = recipe.evaluation.every_steps  # causal LMs only (the recipe refuses it for other tasks)
    if every and not state.curve and state.before is not None:
        state.curve.append(curve.point(0, 0, 0.0, 0.0, state.before, recipe.data.seq_len))
    clock = curve.Clock(*state.clock)

    shown = bar(total=t.max_steps, initial=state.step, show=main, desc="train", unit="step")
    # loss sum, micro-batches, tokens since last log: float64 on the CPU, summed over processes as fp32 on the
    # device (MPS has no float64)
    window = torch.zeros(3, dtype=torch.float64)
    samples, tokens = state.samples[rank], state.tokens[rank]
    tick, cpu0 = time.perf_counter(), time.process_time()
    model.train()
    while state.step < t.max_steps:
        sampler.set_position(state.epoch, state.offset)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = objective(model, batch)
                accelerator.backward(loss)
                if accelerator.sync_gradients and t.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            mask = batch.get("attention_mask")  # a PoSE row of several documents has a 4-D one
            n_tok = int(mask.sum()) if mask is not None and mask.ndim == 2 else batch["input_ids"].numel()
            window += torch.tensor([loss.item(), 1.0, n_tok], dtype=torch.float64)
            samples, tokens = samples + batch["input_ids"].shape[0], tokens + n_tok
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            state.step, state.offset = state.step + 1, state.offset + t.batch_size
            shown.update(1)
            if state.step % t.logging_steps == 0 or state.step == t.max_steps:
                total = accelerator.reduce(window.float().to(accelerator.device), "sum").cpu().double()
                seconds = time.perf_counter() - tick
                state.train_seconds += seconds
                row = {"step": state.step, "loss": total[0].item() / total[1].item(),
                       "lr": scheduler.get_last_lr()[0], "tokens_per_s": total[2].item() / seconds,
                       "elapsed_s": state.train_seconds,
                       "cpu_s": time.process_time() - cpu0}  # this session's process CPU time: robust to a busy machine
                state.log.append(row)
                shown.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_s']:.0f}")
                window.zero_()
                tick = time.perf_counter()
            if every and state.step % every == 0:
                wall, cpu = clock.totals(lambda x: accelerator.reduce(x.to(accelerator.device), "sum").cpu())
                n = int(accelerator.reduce(torch.tensor([tokens], device=accelerator.device), "sum").item())
                metrics = _evaluate(model, eval_loader, accelerator, recipe, data, tokenizer)
                state.curve.append(curve.point(state.step, n, wall, cpu, metrics, recipe.data.seq_len))
                clock.resume()
                tick = time.perf_counter()
            if t.save_steps and state.step % t.save_steps == 0 and state.step < t.max_steps:
                state.clock = list(clock.totals(lambda x: accelerator.reduce(x.to(accelerator.device), "sum").cpu()))
                counts = accelerator.gather(torch.tensor([[samples, tokens]], device=accelerator.device)).cpu()
                state.samples, state.tokens = counts[:, 0].tolist(), counts[:, 1].tolist()
                _save_checkpoint(accelerator, out, state, t.save_total_limit)
                clock.resume()
                tick = time.perf_counter()
            if state.step >= t.max_steps:
                break
        else:
            state.epoch, state.offset = state.epoch + 1, 0
    shown.close()
    counts = accelerator.gather(torch.tensor([[samples, tokens]], device=accelerator.device)).cpu()
    state.samples, state.tokens = counts[:, 0].tolist(), counts[:, 1].tolist()

    after = _evaluate(model, eval_loader, accelerator, recipe, data, tokenizer) if recipe.evaluation.after else None
    accelerator.wait_for_everyone()
    record.details = {
        "steps": state.step, "world_size": world, "samples_per_rank": state.samples, "tokens_per_rank": state.tokens,
        "train_seconds": state.train_seconds,
        "tokens_per_s": sum(state.tokens) / state.train_seconds if state.train_seconds else None,
        **({"curve": state.curve} if every else {}),
    }
    unwrapped = accelerator.unwrap_model(model)
    swapped = {"scheme": recipe.posenc.scheme, "options": dict(recipe.posenc.options),
               "posenc": getattr(unwrapped.config, "posenc", None) if describe(unwrapped) else None}
    record.runs = [results.Run(label, **(swapped if label != "original" else {}), metrics=metrics)
                   for label, metrics in (("original", state.original), ("before training", state.before),
                                          ("after training", after)) if metrics is not None]
    if main:
        write_json(out / "loss.json", state.log)
        record.save(out / "results.json", complete=True)
        if recipe.output.plot:
            losses = {run.label: task.held_out_loss(recipe, run.metrics) for run in record.runs}
            plots.loss_curve(
                state.log, out / "loss.png",
                reference=("eval, before the swap", losses["original"]) if "original" in losses else None,
                points=[(f"eval {label}", step, losses[label])
                        for label, step in (("before training", 0), ("after training", state.step)) if label in losses],
                curve=state.curve)
            if state.curve:
                plots.recovery_curve(state.curve, out / "curve.png", reference=state.original, seq_len=recipe.data.seq_len)
    if recipe.output.save_model:
        weights = accelerator.get_state_dict(model)  # collective: gathers FSDP shards, on every rank
        if main:
            modeling.save_model(accelerator.unwrap_model(model), tokenizer, recipe, out, weights,
                                sharded=accelerator.distributed_type == DistributedType.FSDP)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return record
