"""The positional pieces that transformers' `Trainer` / `Seq2SeqTrainer` and TRL's `SFTTrainer` take
(`PositionalPieces`; the trainers `PosEncTrainer`, `PosEncSeq2SeqTrainer`, `PosEncSFTTrainer`, each with the arguments
class it takes): the loss (`compute_loss`), the held-out tables as Trainer's evaluation
metrics, the recovery curve and the run's own measures (`RecoveryCallback`), the stop on Ctrl-C or SIGTERM
(`StopOnSignal`), and a labelled progress bar. The loop, the evaluation loop, the optimizer and its schedule, gradient
accumulation, clipping, checkpoints, resume, RNG state and reporting (`report_to`) are Trainer's; a causal LM's
packing, labels, padding and loss are TRL's."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import torch
from accelerate import PartialState
from accelerate.utils import gather
from transformers import (EvalPrediction, Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainerCallback,
                          TrainingArguments)
from transformers.trainer_callback import ExportableState, ProgressCallback
from trl import SFTConfig, SFTTrainer

from ..evaluation import held_out
from ..progress import bar
from . import curve, objectives

Tables = dict[str, dict[str, dict[str, Any]]]
# (model, per-sample scores of the whole held-out set) -> the metric tables (`tasks.Task.tables`)
MakeTables = Callable[[torch.nn.Module, dict[str, torch.Tensor]], Tables]


class PositionalPieces:
    """What a recipe adds to transformers' `Trainer` or TRL's `SFTTrainer` (the classes below): the recipe's
    objective and held-out tables. The next-token loss is the trainer's own (SFTTrainer's from its fused LM head),
    given the target tokens of the whole accumulated batch over every process (`num_items_in_batch`); distillation
    divides its sums by the same count, and its teacher is placed once the student is prepared (sharded alike under
    FSDP2).

    Evaluation is Trainer's (`eval_dataset`, `eval_strategy`, `eval_on_start`), each batch scored by the model's own
    forward (`Trainer.compute_loss`: its loss and logits in one pass): the task's per-sample scores of each
    batch's logits are gathered over processes, then made into the tables `hf-posenc eval` writes (`tables`, kept
    for results.json and the curve) and logged flat (`eval_perplexity/128/loss`, ...), so they reach `report_to`;
    `eval_loss` is the task's held-out loss. `why` labels the pass on the progress bar; `eval_collator` collates the
    held-out batches where they differ from training's (PoSE positions are training's only)."""

    def __init__(self, *args: Any, objective: objectives.Objective,
                 scores: Callable[..., dict[str, torch.Tensor]] | None = None, tables: MakeTables | None = None,
                 held_out_loss: Callable[[Tables], float] | None = None, eval_collator: Any = None,
                 **kwargs: Any) -> None:
        if tables is not None:  # else Trainer's own evaluation (its eval_loss)
            kwargs.update(compute_metrics=self._held_out, preprocess_logits_for_metrics=self._scores)
        super().__init__(*args, **kwargs)
        self.objective, self.placed = objective, objective.teacher is None
        self.make_scores, self.make_tables, self.held_out_loss = scores, tables, held_out_loss
        self.eval_collator = eval_collator
        self.counts = [0, 0]  # this rank's samples and tokens trained on in this session
        self.tables: Tables | None = None  # the latest evaluation's
        self.why = "held-out"

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        if not model.training:  # evaluation: the model's own loss and logits, one forward (SFTTrainer's would run two)
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
        mask = inputs.get("attention_mask")  # a PoSE row of several documents has a 4-D one
        tokens = int(mask.sum()) if mask is not None and mask.ndim == 2 else inputs["input_ids"].numel()
        self.counts = [self.counts[0] + inputs["input_ids"].shape[0], self.counts[1] + tokens]
        if not self.objective.distil:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not self.placed:
            self.objective.teacher.place(self.accelerator)
            self.placed = True
        scaled = self.model_accepts_loss_kwargs and num_items_in_batch is not None
        loss = self.objective(model, inputs, num_items_in_batch if scaled else None)
        if scaled and self.args.average_tokens_across_devices:  # DDP averages gradients over the processes
            loss = loss * self.accelerator.num_processes
        return loss

    def _scores(self, logits: Any, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """A batch's per-sample scores, what Trainer gathers instead of its logits (an encoder-decoder's come first)."""
        return self.make_scores(logits[0] if isinstance(logits, tuple) else logits, labels)

    def _held_out(self, prediction: EvalPrediction) -> dict[str, float]:
        """The tables of the gathered scores, on every rank alike (their suites' forwards are collective under FSDP),
        under the training's autocast; flat numbers for `Trainer.log`."""
        scores = {name: torch.as_tensor(values) for name, values in prediction.predictions.items()}
        with torch.no_grad(), self.accelerator.autocast():
            self.tables = self.make_tables(self.accelerator.unwrap_model(self.model), scores)
        flat = {f"{table}/{row}/{column}": value for table, rows in self.tables.items() for row, cells in rows.items()
                for column, value in cells.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
        return {"loss": self.held_out_loss(self.tables), **flat}

    def evaluate(self, *args: Any, why: str | None = None, **kwargs: Any) -> dict[str, float]:
        self.tables, self.why = None, why or self.why
        return super().evaluate(*args, **kwargs)

    def evaluate_other(self, model: torch.nn.Module, why: str, prefix: str) -> Tables:
        """Trainer's evaluation of a model other than the one training (the model before the swap, which shares
        its frozen tensors), once training prepared that one; logged as `prefix`_... Never prepared itself, it
        runs under the training's autocast explicitly."""
        kept, self.model = self.model, model.to(self.args.device)
        try:
            with self.accelerator.autocast():
                self.evaluate(metric_key_prefix=prefix, why=why)
        finally:
            self.model = kept
        return self.tables

    def _get_dataloader(self, dataset: Any, description: str, batch_size: int, sampler_fn: Any = None,
                        is_training: bool = False, dataloader_key: str | None = None) -> Any:
        """Every held-out sample is scored: `dataloader_drop_last` is the training batches' only; held-out batches
        are collated by `eval_collator` when there is one."""
        drop, collator = self.args.dataloader_drop_last, self.data_collator
        self.args.dataloader_drop_last = drop and is_training
        if not is_training and self.eval_collator is not None:
            self.data_collator = self.eval_collator
        try:
            return super()._get_dataloader(dataset, description, batch_size, sampler_fn, is_training, dataloader_key)
        finally:
            self.args.dataloader_drop_last, self.data_collator = drop, collator

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Trainer finds missing keys by name, so a tied head, which save_pretrained leaves out of every checkpoint,
        was "missing" on each resume; a key is missing only when its tensor was loaded under no other name."""
        tensors = self.model.state_dict(keep_vars=True)
        loaded = {id(t) for name, t in tensors.items() if name not in load_result.missing_keys}
        missing = [name for name in load_result.missing_keys if id(tensors.get(name)) not in loaded]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))


class PosEncTrainer(PositionalPieces, Trainer):
    """transformers' `Trainer` with the positional pieces: classification recipes."""

    arguments = TrainingArguments


class PosEncSeq2SeqTrainer(PositionalPieces, Seq2SeqTrainer):
    """transformers' `Seq2SeqTrainer` with the positional pieces: encoder-decoder recipes (the held-out exact match
    is greedy decoding's, from one teacher-forced forward: `tasks._seq2seq_scores`)."""

    arguments = Seq2SeqTrainingArguments


class PosEncSFTTrainer(PositionalPieces, SFTTrainer):
    """TRL's `SFTTrainer` with the positional pieces: causal-LM recipes (packing, labels, completion-only loss,
    padding and the training loss are TRL's)."""

    arguments = SFTConfig

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """The run folder's model card is hf-posenc's (`hub`), written with the model; none into each checkpoint."""


class Interrupted(KeyboardInterrupt):
    """A signal ended the run (`signum`: which); what it saved is on disk."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopOnSignal(TrainerCallback):
    """Ctrl-C (SIGINT) and SIGTERM (`kill`, a scheduler's notice) alike end training after the step under way, saved
    as a checkpoint where the recipe saves at all, so that `--resume` continues it: Trainer saves and stops
    (`control.should_save`, `should_training_stop`) and `listening` raises `Interrupted`. Outside the loop, and at
    Ctrl-C once a stop is under way (the user's "now"), `Interrupted` is raised at once; a further SIGTERM waits for
    the step, as torchrun's agent passes on to its processes the SIGTERM a scheduler sent the whole job. (Trainer's
    `enable_jit_checkpoint` takes SIGTERM only, saves mid-step whatever the recipe says, and returns as if training
    had finished.)"""

    def __init__(self) -> None:
        self.signum = 0
        self.looping = False

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """The handlers, for the run only (Python lets the main thread alone set them)."""
        main = threading.current_thread() is threading.main_thread()
        kept = {s: signal.signal(s, self._received) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            yield
        finally:
            for number, handler in kept.items():
                signal.signal(number, handler)

    def stopped(self) -> None:
        """Raise `Interrupted` if a signal ended training."""
        if self.signum:
            raise Interrupted(self.signum)

    def _received(self, signum: int, frame: Any) -> None:
        if not self.looping or (self.signum and signum == signal.SIGINT):
            raise Interrupted(signum)
        self.signum = self.signum or signum

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.looping = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        processes, signum = PartialState(), self.signum
        if processes.num_processes > 1:  # every process stops after the same step, or the next one's collectives hang
            signum = int(gather(torch.tensor([signum], device=processes.device)).max())
            if signum and not self.signum:  # never overwritten: a signal that came during the gather counts next step
                self.signum = signum
        if signum:
            control.should_save = control.should_save or args.save_strategy != "no"
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.looping = False


class RecoveryCallback(TrainerCallback, ExportableState):
    """What Trainer's evaluations during training make of the run: the model before the swap scored at the start
    (`original`, the reference), the first evaluation (`before`, Trainer's `eval_on_start`), the recovery curve (a
    point at each evaluation, against steps, tokens and the training clock), and an evaluation at the last step
    (`after`) when `after` is asked. Also the training clock (evaluation and checkpoints left out), throughput in
    each loss row, and per-rank counts.

    What a resume needs of it is taken on every rank before each checkpoint (`snapshot`, collective) and written
    by Trainer into the checkpoint's trainer_state.json (`state`, main process only); `restore` reads it back."""

    KEPT = ("original", "before", "curve", "clock", "samples", "tokens")

    def __init__(self, trainer: PositionalPieces, seq_len: int, after: bool, reference: torch.nn.Module | None = None,
                 on_original: Callable[[Tables], None] | None = None) -> None:
        self.trainer, self.seq_len, self.want_after = trainer, seq_len, after
        self.reference, self.on_original = reference, on_original
        self.original: Tables | None = None
        self.before: Tables | None = None
        self.after: Tables | None = None
        self.curve: list[dict[str, Any]] = []
        self.clock = [0.0, 0.0]  # wall and CPU seconds of earlier sessions (a resumed run)
        self.samples: list[int] = []  # per rank, earlier sessions
        self.tokens: list[int] = []
        self.saved: dict[str, Any] = {}
        self.meter: curve.Clock | None = None
        self.looping = False
        self.tick, self.cpu0, self.last_tokens = time.perf_counter(), time.process_time(), 0

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": self.saved}

    def restore(self, attributes: dict[str, Any]) -> None:
        for name in self.KEPT:
            setattr(self, name, attributes.get(name))

    def snapshot(self) -> dict[str, Any]:
        """What the run has measured so far, over every session and process (collective); the clock runs on."""
        wall, cpu = self.meter.totals(self.summed)
        self.meter.resume()
        accelerator = self.trainer.accelerator
        counts = accelerator.gather(torch.tensor([self.trainer.counts], device=accelerator.device)).cpu().tolist()
        earlier = [self.samples or [0] * len(counts), self.tokens or [0] * len(counts)]
        self.saved = {"original": self.original, "before": self.before, "curve": self.curve, "clock": [wall, cpu],
                      "samples": [a + c[0] for a, c in zip(earlier[0], counts)],
                      "tokens": [a + c[1] for a, c in zip(earlier[1], counts)]}
        return self.saved

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        accelerator = self.trainer.accelerator
        return accelerator.reduce(values.to(accelerator.device), "sum").cpu()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.reference is not None and self.original is None:  # the student is prepared: evaluation leaves it be
            self.original = self.trainer.evaluate_other(self.reference, "before the swap (reference)", "eval_original")
            if self.on_original is not None:
                self.on_original(self.original)
        self.reference = None  # the teacher, if any, holds what it needs
        self.meter = curve.Clock(*self.clock)
        self.looping, self.tick = True, time.perf_counter()
        # the label of Trainer's evaluation on start
        self.trainer.why = "swapped, before step 1 (start)"

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        last = state.global_step >= state.max_steps
        control.should_evaluate = control.should_evaluate or (self.want_after and last)
        if control.should_evaluate:  # Trainer evaluates after this call: off the training clock
            self.trainer.why = "after training" if last else f"curve at step {state.global_step}"
            self.meter.pause()
        if control.should_save:  # DefaultFlowCallback, before this one, decided: Trainer saves after this call
            self.snapshot()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        tables = self.trainer.tables
        if not self.looping or tables is None or self.trainer.why.startswith("before the swap"):
            return
        if state.global_step == 0 and self.before is None:
            self.before = tables
        if state.global_step >= state.max_steps:
            self.after = tables
        measured = self.snapshot()  # collective: every rank evaluates; resumes the clock
        row = held_out.curve_point(state.global_step, sum(measured["tokens"]), *measured["clock"], tables,
                                   self.seq_len)
        if row is not None and not (self.curve and self.curve[-1]["step"] == state.global_step):
            self.curve.append(row)
            self.saved["curve"] = self.curve

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.looping = False

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Throughput and the session's CPU time into the row Trainer just logged (its log_history is loss.json)."""
        row = state.log_history[-1] if state.log_history else {}
        if "loss" not in row or self.meter is None:
            return
        seconds, tokens = time.perf_counter() - self.tick, self.trainer.counts[1]
        row["tokens_per_s"] = (tokens - self.last_tokens) * self.trainer.accelerator.num_processes / seconds
        row["elapsed_s"] = self.meter.elapsed()  # training wall seconds so far (benchmarks/train_throughput.py)
        row["cpu_s"] = time.process_time() - self.cpu0  # this process's: robust to a busy machine
        self.tick, self.last_tokens = time.perf_counter(), tokens


class LabelledProgress(ProgressCallback):
    """Trainer's progress bars as the project draws its bars (`progress.bar`: labelled, with an estimate, drawn in a
    terminal that reports 0 columns too), the loss beside it rather than a printed dict per row; an evaluation's
    bar says which pass it is (`PositionalPieces.why`)."""

    def __init__(self, trainer: PositionalPieces) -> None:
        super().__init__()
        self.trainer = trainer

    def on_prediction_step(self, args: Any, state: Any, control: Any, eval_dataloader: Any = None,
                           **kwargs: Any) -> None:
        if state.is_world_process_zero and eval_dataloader is not None:
            if self.prediction_bar is None:
                self.prediction_bar = bar(total=len(eval_dataloader), desc=f"held-out: {self.trainer.why}",
                                          unit="batch")
            self.prediction_bar.update(1)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.training_bar is not None and logs and "loss" in logs:
            self.training_bar.set_postfix(loss=f"{logs['loss']:.4f}", lr=f"{logs.get('learning_rate', 0):.2e}")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.training_bar = bar(total=state.max_steps, initial=state.global_step, desc="train", unit="step")
        self.current_step = state.global_step
