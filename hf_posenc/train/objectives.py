"""Training objectives: next-token loss, and distillation from the model before the swap.

The teacher is the same checkpoint with its own positions (no second download): a structural copy of
the model taken before `patch`, whose parameters *are* the student's (the same tensors, so no second
copy of the weights and no optimizer state) except those the run trains in full, which get a frozen
clone taken before the first step. With LoRA and no fully trained groups the teacher costs no weights
at all; with norms trained in full it costs their size; with full fine-tuning one frozen copy.
The teacher is never patched, so its logits are the original model's bit for bit.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from .recipe import Recipe


class Teacher:
    """The model before the swap, sharing every parameter the student does not train in full.

    Build it from the loaded model before `patch`; call `freeze_trained` once the trainable parameters
    are chosen (before any optimizer step) to clone those the student will change.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        self.model = copy.deepcopy(model, memo=dict(shared))  # module objects copied, tensors shared
        self.model.eval()
        self.frozen_bytes = 0

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
        self.frozen_bytes = sum(p.numel() * p.element_size() for p in clones.values())
        return self.frozen_bytes

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor], hidden: bool) -> Any:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return self.model(**inputs, output_hidden_states=hidden, use_cache=False)


def token_weights(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """1 for every scored position (a 2-D attention mask's ones; every position otherwise), as float."""
    mask = batch.get("attention_mask")
    if mask is not None and mask.ndim == 2:
        return mask.float()
    return torch.ones(batch["input_ids"].shape, dtype=torch.float32, device=batch["input_ids"].device)


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor, weights: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    """Forward KL(p_teacher || p_student) at temperature T, times T^2 (Hinton et al. 2015, so gradients keep
    their scale across T), averaged over the positions `weights` marks."""
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    per_token = (log_t.exp() * (log_t - log_s)).sum(-1)
    return (per_token * weights).sum() / weights.sum() * temperature**2


def hidden_mse(student: tuple[torch.Tensor, ...], teacher: tuple[torch.Tensor, ...], weights: torch.Tensor) -> torch.Tensor:
    """Mean squared error of each layer's output hidden states (the embeddings' output left out), averaged
    over layers and the positions `weights` marks (LongReD-style hidden-state distillation)."""
    w = weights[..., None]
    per_layer = [((s.float() - t.float()) ** 2 * w).sum() / (w.sum() * s.shape[-1]) for s, t in zip(student[1:], teacher[1:])]
    return torch.stack(per_layer).mean()


class Objective:
    """`objective(model, batch) -> loss` for the recipe's `training.objective` (see `OBJECTIVES`)."""

    def __init__(self, recipe: Recipe, teacher: Teacher | None) -> None:
        t = recipe.training
        self.lm, self.distil = OBJECTIVES[t.objective]
        self.teacher, self.options = teacher, t.distill

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.distil:
            return model(**batch).loss
        o = self.options
        hidden = o["hidden_weight"] > 0
        inputs = batch if self.lm else {k: v for k, v in batch.items() if k != "labels"}
        out = model(**inputs, output_hidden_states=hidden)
        target = self.teacher(batch, hidden)
        weights = token_weights(batch)
        loss = o["weight"] * kl_to_teacher(out.logits, target.logits, weights, o["temperature"])
        if hidden:
            loss = loss + o["hidden_weight"] * hidden_mse(out.hidden_states, target.hidden_states, weights)
        return loss + out.loss if self.lm else loss


# objective -> (next-token loss, distillation)
OBJECTIVES: dict[str, tuple[bool, bool]] = {"lm": (True, False), "distill": (False, True), "lm+distill": (True, True)}


def build(recipe: Recipe, model: torch.nn.Module) -> tuple[Objective, Teacher | None]:
    """The objective and its teacher (None for 'lm'); call before `patch` touches `model`."""
    teacher = Teacher(model) if OBJECTIVES[recipe.training.objective][1] else None
    return Objective(recipe, teacher), teacher

