"""Fine-tuning recipes: swap a model's positional scheme, then recover it on transformers' Trainer (a causal LM on
TRL's SFTTrainer) + peft.

The same code runs under every launcher (the command line lives in `hf_posenc.cli.train`):

    accelerate launch --config_file CFG -m hf_posenc.train --config RECIPE.yaml [--field value ...]
    python -m hf_posenc.train --config RECIPE.yaml              # one process
    hf-posenc train RECIPE.yaml --accelerate-config cpu_2proc   # a shipped config, by name

    recipe      the recipe dataclasses (ours beside TrainingArguments) and their cross-field checks
    reading     a recipe YAML and its --field overrides into a Recipe
    inputs      the data: load, check columns, tokenize (a causal LM's packing, labels and padding: TRL's)
    modeling    the model: load, swap the scheme, choose what trains (peft, modules_to_save), save
    run_folder  preflight (every check before compute, once per run), run.json, the checkpoints Trainer wrote
    trainer     what Trainer and SFTTrainer take (PositionalPieces): the objective's compute_loss, the held-out
                tables as their evaluation metrics (so they reach report_to), the callback that makes results.json's runs and recovery curve of its
                evaluations, a labelled bar, StopOnSignal (Ctrl-C and SIGTERM end the step under way, save, and
                name the command that continues)
    runner      a run as setup -> Trainer.train (its evaluations included) -> finish, results.json
"""

import importlib
from typing import Any

from .reading import load_recipe
from .recipe import Recipe

__all__ = ["Checked", "Recipe", "load_recipe", "preflight", "train"]


# name -> its module, imported on first use: they import torch, and a recipe mistake is refused before it loads
LAZY = {"Checked": "run_folder", "preflight": "run_folder", "train": "runner"}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(f"{__name__}.{LAZY[name]}"), name)
    raise AttributeError(f"module 'hf_posenc.train' has no attribute {name!r}")
