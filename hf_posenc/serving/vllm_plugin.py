"""The vLLM plug-in (entry point `vllm.general_plugins`: hf-posenc): registers the architectures that patched
folders name (`hf_posenc.writing.own_architecture`), so vLLM serves them with their own positions.

vLLM calls `register` in every process it starts, before it reads a model; registering lazily
("module:Class") keeps vLLM's model code unimported until a folder asks for one of these classes.
"""

from __future__ import annotations

from ..writing import own_architecture
from .positions import ARCHITECTURES

__all__ = ["register"]


def register() -> None:
    """Register `PosEnc<stock>` for every stock architecture hf-posenc serves (idempotent, as vLLM needs)."""
    from vllm import ModelRegistry

    for stock in ARCHITECTURES:
        name = own_architecture(stock)
        ModelRegistry.register_model(name, f"hf_posenc.serving.vllm_models:{name}")
