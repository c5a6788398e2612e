"""Fine-tuning recipes: swap a model's positional scheme, then recover it with accelerate + peft.

The same code runs under every launcher (the command line lives in `hf_posenc.cli.train`):

    accelerate launch --config_file CFG -m hf_posenc.cli train RECIPE.yaml [--section.field value ...]
    python -m hf_posenc.cli train RECIPE.yaml                   # one process
    hf-posenc train RECIPE.yaml --accelerate-config cpu_2proc   # a shipped config, by name

    recipe    the recipe dataclasses, parsed from YAML and overrides
    inputs    the data: load, check columns, tokenize, a resumable sampler
    modeling  the model: load, swap the scheme, choose what trains (peft), save
    runner    the training loop under one Accelerator, checkpoints, results.json
"""

from typing import Any

from .recipe import Recipe, load_recipe

__all__ = ["Checked", "Recipe", "load_recipe", "preflight", "train"]


def __getattr__(name: str) -> Any:
    """The runner imports torch: only when used, so a recipe mistake is refused before torch loads."""
    if name in ("Checked", "preflight", "train"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'hf_posenc.train' has no attribute {name!r}")
