"""Training objectives: next-token loss, and distillation from the model before the swap.

The teacher is the same checkpoint with its own positions (no second download): a structural copy of
the model taken before `patch`, whose parameters *are* the student's (the same tensors, so no second
copy of the weights and no optimizer state) except those the run trains in full, which get a frozen
clone taken before the first step. With LoRA and no fully trained groups the teacher costs no weights
at all; with norms trained in full it costs their size; with full fine-tuning one frozen copy.
The teacher is never patched, so its logits are the original model's bit for bit.

Under FSDP2 nothing can be shared: `fully_shard` replaces the student's parameters by DTensor shards, so a
teacher holding the originals would keep a whole unsharded copy on every process (and with accelerate's
ram-efficient loading, processes other than the first load no weights at all: rank 0's reach them only
at sharding), and one parameter cannot belong to two sharded roots. There the teacher is its own frozen
copy, sharded as the student is (`Teacher.place`): each process holds 1/N of it, and its forward is
collective like the student's.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F

from .recipe import Recipe

if TYPE_CHECKING:
    from accelerate import Accelerator


def _bytes(params: Any) -> int:
    return sum(p.numel() * p.element_size() for p in params)


class Teacher:
    """The model before the swap, sharing every parameter the student does not train in full.

    Build it from the loaded model before `patch`; call `freeze_trained` once the trainable parameters
    are chosen (before any optimizer step) to clone those the student will change. With `share=False`
    (FSDP) it is a frozen copy of every tensor instead, sharded by `place`.
    """

    def __init__(self, model: torch.nn.Module, share: bool = True) -> None:
        shared = {id(t): t for t in [*model.parameters(), *model.buffers()]} if share else {}
        self.model = copy.deepcopy(model, memo=shared)  # module objects copied, tensors shared if `share`
        self.model.eval()
        if not share:
            self.model.requires_grad_(False)
        self.share, self.sharded = share, False
        self.autocast: Callable[[], Any] = contextlib.nullcontext  # the student's, once placed
        self.frozen_bytes = 0 if share else _bytes(self.model.parameters())  # tied weights counted once

    def place(self, accelerator: Accelerator) -> None:
        """Once `accelerator.prepare` took the student: a teacher of its own (FSDP2) is sharded as accelerate
        sharded the student, by its `fsdp2_prepare_model` (the same groups, so the forward is collective like
        the student's); a sharing one moves its clones and buffers to the student's device. Either runs under
        the student's autocast: a bf16 student beside an fp32 teacher is two different models on a GPU."""
        self.autocast = accelerator.autocast
        if self.share:
            self.model.to(accelerator.device)
            return
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        self.model, self.sharded = fsdp2_prepare_model(accelerator, self.model), True

    def freeze_trained(self) -> int:
        """Replace every shared parameter that now requires grad by a frozen clone; returns the bytes cloned.
        Tied parameters (SmolLM2's embedding and head) stay tied to one clone."""
        clones: dict[int, torch.nn.Parameter] = {}
        for module in self.model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and p.requires_grad:
                    if id(p) not in clones:
                        clones[id(p)] = torch.nn.Parameter(p.detach().clone(), requires_grad=False)
                    module._parameters[name] = clones[id(p)]
        self.frozen_bytes += _bytes(clones.values())
        return self.frozen_bytes

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor], hidden: bool) -> Any:
        """The teacher's outputs; sharded, a collective call that every process makes."""
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with self.autocast():
            out = self.model(**inputs, output_hidden_states=hidden, use_cache=False)
        if self.sharded:
            from torch.distributed.fsdp import FSDPModule

            # the root and the embedding/head group keep their gathered weights after a forward, for the
            # backward that a student has and a teacher never does: free them
            for module in self.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
        return out


def token_weights(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """1 for every scored position (a 2-D attention mask's ones; every position otherwise), as float."""
    mask = batch.get("attention_mask")
    if mask is not None and mask.ndim == 2:
        return mask.float()
    return torch.ones(batch["input_ids"].shape, dtype=torch.float32, device=batch["input_ids"].device)


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor, weights: torch.Tensor,
                  temperature: float, total: Any = None) -> torch.Tensor:
    """Forward KL(p_teacher || p_student) at temperature T, times T^2 (Hinton et al. 2015, so gradients keep
    their scale across T), summed over the positions `weights` marks and divided by `total` (the target tokens of
    the whole accumulated batch, so that micro-batches weigh by their tokens), or averaged when it is None."""
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    per_token = (log_t.exp() * (log_t - log_s)).sum(-1)
    return (per_token * weights).sum() / (weights.sum() if total is None else total) * temperature**2


def hidden_mse(student: tuple[torch.Tensor, ...], teacher: tuple[torch.Tensor, ...], weights: torch.Tensor,
               total: Any = None) -> torch.Tensor:
    """Mean squared error of each layer's output hidden states (the embeddings' output left out), averaged
    over layers and over the positions `weights` marks (or summed over them and divided by `total`, as
    `kl_to_teacher`): LongReD-style hidden-state distillation."""
    w = weights[..., None]
    count = w.sum() if total is None else total
    per_layer = [((s.float() - t.float()) ** 2 * w).sum() / (count * s.shape[-1]) for s, t in zip(student[1:], teacher[1:])]
    return torch.stack(per_layer).mean()


class Objective:
    """`objective(model, batch, num_items) -> loss` for the recipe's `objective` (see `OBJECTIVES`).

    `num_items`: the target tokens of the whole accumulated batch over every process (Trainer's
    `num_items_in_batch`); each term is then a sum over this micro-batch divided by it, so the step's loss is the
    mean over its tokens however they fall into micro-batches. None: each term is this micro-batch's mean."""

    def __init__(self, recipe: Recipe, teacher: Teacher | None) -> None:
        self.lm, self.distil = OBJECTIVES[recipe.posenc.objective]
        self.teacher, self.options = teacher, recipe.posenc.distill

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], num_items: Any = None) -> torch.Tensor:
        extra = {"num_items_in_batch": num_items} if num_items is not None else {}
        if not self.distil:
            return model(**batch, **extra).loss
        o = self.options
        hidden = o.hidden_weight > 0
        inputs = {**batch, **extra} if self.lm else {k: v for k, v in batch.items() if k != "labels"}
        out = model(**inputs, output_hidden_states=hidden)
        target = self.teacher(batch, hidden)
        weights = token_weights(batch)
        loss = o.weight * kl_to_teacher(out.logits, target.logits, weights, o.temperature, num_items)
        if hidden:
            loss = loss + o.hidden_weight * hidden_mse(out.hidden_states, target.hidden_states, weights, num_items)
        return loss + out.loss if self.lm else loss


# objective -> (next-token loss, distillation)
OBJECTIVES: dict[str, tuple[bool, bool]] = {"lm": (True, False), "distill": (False, True), "lm+distill": (True, True)}


def build(recipe: Recipe, model: torch.nn.Module, fsdp: bool = False) -> tuple[Objective, Teacher | None]:
    """The objective and its teacher (None for 'lm'); call before `patch` touches `model`. Under FSDP2
    the teacher is its own copy, to be sharded (see `Teacher`)."""
    teacher = Teacher(model, share=not fsdp) if OBJECTIVES[recipe.posenc.objective][1] else None
    return Objective(recipe, teacher), teacher

