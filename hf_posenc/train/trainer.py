"""The positional pieces that transformers' `Trainer` takes: the loss (`PosEncTrainer.compute_loss`), the recovery
curve and the run's own measures (`RecoveryCallback`), the stop on Ctrl-C or SIGTERM (`StopOnSignal`), and a labelled
progress bar. The loop, the optimizer and its schedule, gradient accumulation, clipping, checkpoints, resume and RNG
state are Trainer's."""

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
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState, ProgressCallback

from ..progress import bar
from . import curve, objectives

Evaluate = Callable[[torch.nn.Module], dict[str, dict[str, dict[str, Any]]]]


class PosEncTrainer(Trainer):
    """Trainer with the recipe's objective. The next-token loss is the model's own, given the target tokens of the
    whole accumulated batch over every process (`num_items_in_batch`, as Trainer does for any model taking loss
    kwargs); distillation divides its sums by the same count, and its teacher is placed once the student is
    prepared (sharded alike under FSDP2)."""

    def __init__(self, *args: Any, objective: objectives.Objective, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.objective, self.placed = objective, objective.teacher is None
        self.counts = [0, 0]  # this rank's samples and tokens trained on in this session

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
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

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Trainer finds missing keys by name, so a tied head, which save_pretrained leaves out of every checkpoint,
        was "missing" on each resume; a key is missing only when its tensor was loaded under no other name."""
        tensors = self.model.state_dict(keep_vars=True)
        loaded = {id(t) for name, t in tensors.items() if name not in load_result.missing_keys}
        missing = [name for name in load_result.missing_keys if id(tensors.get(name)) not in loaded]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))


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
    """Held-out evaluation before training and every `every` optimizer steps (the recovery curve), the training
    clock (evaluation and checkpoints left out), throughput in each loss row, and per-rank counts.

    What a resume needs of it is taken on every rank before each checkpoint (`snapshot`, collective) and written
    by Trainer into the checkpoint's trainer_state.json (`state`, main process only); `restore` reads it back."""

    KEPT = ("before", "curve", "clock", "samples", "tokens")

    def __init__(self, evaluate: Evaluate, every: int, seq_len: int, before: bool, trainer: PosEncTrainer) -> None:
        self.evaluate, self.every, self.seq_len, self.want_before, self.trainer = evaluate, every, seq_len, before, trainer
        self.before: dict[str, Any] | None = None
        self.curve: list[dict[str, Any]] = []
        self.clock = [0.0, 0.0]  # wall and CPU seconds of earlier sessions (a resumed run)
        self.samples: list[int] = []  # per rank, earlier sessions
        self.tokens: list[int] = []
        self.saved: dict[str, Any] = {}
        self.meter: curve.Clock | None = None
        self.tick, self.cpu0, self.last_tokens = time.perf_counter(), time.process_time(), 0

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": self.saved}

    def restore(self, attributes: dict[str, Any]) -> None:
        for name in self.KEPT:
            setattr(self, name, attributes[name])

    def snapshot(self) -> dict[str, Any]:
        """What the run has measured so far, over every session and process (collective); the clock runs on."""
        wall, cpu = self.meter.totals(self.summed)
        self.meter.resume()
        accelerator = self.trainer.accelerator
        counts = accelerator.gather(torch.tensor([self.trainer.counts], device=accelerator.device)).cpu().tolist()
        earlier = [self.samples or [0] * len(counts), self.tokens or [0] * len(counts)]
        self.saved = {"before": self.before, "curve": self.curve, "clock": [wall, cpu],
                      "samples": [a + c[0] for a, c in zip(earlier[0], counts)],
                      "tokens": [a + c[1] for a, c in zip(earlier[1], counts)]}
        return self.saved

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        accelerator = self.trainer.accelerator
        return accelerator.reduce(values.to(accelerator.device), "sum").cpu()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.want_before and self.before is None:  # the prepared model: sharded under FSDP like the student
            self.before = self.evaluate(self.trainer.model_wrapped, "swapped, before step 1 (start)")
            if self.every:
                self.curve.append(curve.point(0, 0, 0.0, 0.0, self.before, self.seq_len))
        self.meter = curve.Clock(*self.clock)
        self.tick = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.every and state.global_step % self.every == 0:
            self.meter.pause()
            metrics = self.evaluate(self.trainer.model_wrapped, f"curve at step {state.global_step}")
            measured = self.snapshot()
            self.curve.append(curve.point(state.global_step, sum(measured["tokens"]), *measured["clock"], metrics,
                                          self.seq_len))
        if control.should_save:  # DefaultFlowCallback, before this one, decided: Trainer saves after this call
            self.snapshot()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Throughput and the session's CPU time into the row Trainer just logged (its log_history is loss.json)."""
        row = state.log_history[-1] if state.log_history else {}
        if "loss" not in row:
            return
        seconds, tokens = time.perf_counter() - self.tick, self.trainer.counts[1]
        row["tokens_per_s"] = (tokens - self.last_tokens) * self.trainer.accelerator.num_processes / seconds
        row["elapsed_s"] = self.meter.elapsed()  # training wall seconds so far (benchmarks/train_throughput.py)
        row["cpu_s"] = time.process_time() - self.cpu0  # this process's: robust to a busy machine
        self.tick, self.last_tokens = time.perf_counter(), tokens


class LabelledProgress(ProgressCallback):
    """Trainer's progress bar as the project draws its bars (`progress.bar`: labelled, with an estimate, drawn in a
    terminal that reports 0 columns too), the loss beside it rather than a printed dict per row."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.training_bar = bar(total=state.max_steps, initial=state.global_step, desc="train", unit="step")
        self.current_step = state.global_step

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.training_bar is not None and logs and "loss" in logs:
            self.training_bar.set_postfix(loss=f"{logs['loss']:.4f}", lr=f"{logs.get('learning_rate', 0):.2e}")
