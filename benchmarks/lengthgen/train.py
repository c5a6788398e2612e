"""One run of the study: a random tiny decoder with one arm's positions, trained with transformers' `Trainer` on
one task's short instances (loss on the answer only), then scored by exact match in distribution (the gate) and
on every longer length (`hf_posenc.evaluation.lengthgen`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import datasets
import paper_tasks
import torch
import transformers
from arms import Arm
from settings import Settings

import hf_posenc as hp
from hf_posenc import analysis
from hf_posenc.evaluation.lengthgen import scoring, tasks
from hf_posenc.evaluation.lengthgen.tasks import Example
from hf_posenc.evaluation.lengthgen.vocab import build_tokenizer
from hf_posenc.tiny_decoder import tiny_model

IGNORE = -100  # labels transformers' loss skips: the prompt's tokens


def tokenizer_of(s: Settings) -> Any:
    """The word-level tokenizer of the settings' tasks: the digit tasks' or the paper's splits'."""
    return build_tokenizer(paper_tasks.WORDS) if s.paper else build_tokenizer()


def splits_of(task: str, s: Settings, seed: int) -> dict[str, list[Example]]:
    """A run's train, in-distribution (the gate) and out-of-distribution examples."""
    if s.paper:
        return paper_tasks.split(task, train=s.train_examples, iid=s.iid_per_length, test=s.test_per_length,
                                 seed=seed, lengths=s.lengths_of(task) if s.train_lengths else None)
    return tasks.split(task, s.train_lengths, s.test_lengths, train=s.train_examples, iid=s.iid_per_length,
                       test=s.test_per_length, seed=seed)


def init_model(arm: Arm, s: Settings, seed: int) -> transformers.PreTrainedModel:
    """The study's decoder (`hf_posenc.tiny_decoder`, in the settings' shape) with the arm's positions patched in;
    the same weights draw for every arm of a seed up to what the scheme adds."""
    model = tiny_model(max(s.test_lengths or (1,)), seed, positions=s.table, tokenizer=tokenizer_of(s),
                       n_embd=s.width, n_layer=s.layers, n_head=s.heads, activation_function=s.activation)
    if arm.scheme is not None:
        hp.patch(model, arm.scheme, **arm.options)
    return model


def encoded(examples: list[Example], tokenizer: Any) -> datasets.Dataset:
    """Token ids of prompt + answer, labels only on the answer (what the model must produce)."""
    rows = {"input_ids": [], "labels": []}
    for e in examples:
        prompt, full = tokenizer(e.prompt)["input_ids"], tokenizer(e.prompt + e.target)["input_ids"]
        rows["input_ids"].append(full)
        rows["labels"].append([IGNORE] * len(prompt) + full[len(prompt):])
    return datasets.Dataset.from_dict(rows)


def train(model: transformers.PreTrainedModel, examples: list[Example], s: Settings, tokenizer: Any, seed: int,
          work: Path, steps: int, lr: float, callbacks: tuple[transformers.TrainerCallback, ...] = ()) -> float:
    """`steps` AdamW steps of `s.batch_size` examples at peak `lr` (linear warm-up, cosine decay); returns the last
    logged loss. `callbacks`: the pilot's probe of the in-distribution exact match while it trains."""
    args = transformers.TrainingArguments(
        output_dir=str(work), max_steps=steps, per_device_train_batch_size=s.batch_size, learning_rate=lr,
        warmup_steps=s.warmup, weight_decay=s.weight_decay, lr_scheduler_type="cosine", seed=seed,
        data_seed=seed, save_strategy="no", report_to=[], logging_steps=max(1, steps // 10), disable_tqdm=True,
        use_cpu=True, dataloader_num_workers=0)
    collator = transformers.DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=encoded(examples, tokenizer),
                                   data_collator=collator, callbacks=list(callbacks))
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return float(logged[-1]) if logged else float("nan")


def score(model: Any, tokenizer: Any, examples: list[Example], table: int | None) -> dict[str, Any]:
    """Exact match by length (string keys, as results.json stores them); lengths whose sequences do not fit a
    learned table of `table` positions are recorded as skipped."""
    fits = [e for e in examples if table is None or 2 * e.length + 2 <= table]
    cells: dict[str, Any] = {str(n): c for n, c in scoring.score(model, tokenizer, fits, batch_size=64).items()} \
        if fits else {}
    for n in sorted({e.length for e in examples} - {e.length for e in fits}):
        cells[str(n)] = {"skipped": f"{2 * n + 2} tokens are past the learned table of {table} positions"}
    return cells


def one_run(name: str, arm: Arm, task: str, seed: int, s: Settings, tokenizer: Any, work: Path) -> dict[str, Any]:
    """Train and score one (arm, task, seed): the run's record for results.json."""
    splits = splits_of(task, s, seed)
    model = init_model(arm, s, seed)
    t0 = time.perf_counter()
    loss = train(model, splits["train"], s, tokenizer, seed, work, s.steps_of(task), s.lr_of(name))
    seconds = time.perf_counter() - t0
    model.eval()
    table = s.table if arm.table else None
    iid_cells = score(model, tokenizer, splits["iid"], table)
    iid = scoring.pooled(iid_cells)
    ood_cells = score(model, tokenizer, splits["ood"], table)
    scored = {int(n): c for n, c in ood_cells.items() if "n" in c}
    longest = max(splits["iid"], key=lambda e: e.length)  # a held-out sequence of the longest trained length
    ids = torch.tensor(tokenizer(longest.prompt + longest.target)["input_ids"])
    # positions added to the tokens: where they sit against the token subspace, and layer 0's four terms
    geometry = analysis.added_positions(model, ids, len(ids)) if arm.added else None
    return {"arm": name, "seed": seed, "task": task, "iid": iid, "iid_by_length": iid_cells,
            "ood": scoring.pooled(scored) if scored else None, "ood_by_length": ood_cells,
            "gate": iid["exact_match"] >= s.gate, "steps": s.steps_of(task), "lr": s.lr_of(name), "train_loss": loss, "train_seconds": round(seconds, 1),
            "score_seconds": round(time.perf_counter() - t0 - seconds, 1),
            "params": sum(p.numel() for p in model.parameters()), "geometry": geometry}
