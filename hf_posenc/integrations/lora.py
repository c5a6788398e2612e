"""peft and TRL: the modules of a patched model that LoRA must train in full."""

from __future__ import annotations

from torch import nn

from ..patching import describe_modules

__all__ = ["modules_to_save"]


def modules_to_save(model: nn.Module) -> list[str]:
    """Names of the modules the current patch installed that carry weights (a new position table, a
    learned bias), for `peft.LoraConfig(modules_to_save=...)`.

    LoRA adapts linear layers only, and a new scheme's own weights start untrained, so they are
    trained in full beside the adapters (and saved with them). Empty for parameter-free schemes
    (alibi, rope, ...) and for an unpatched model.
    """
    names = {id(module): name for name, module in model.named_modules()}
    return [names[id(module)] for module in describe_modules(model)]
