"""Model side of a recipe: load, swap the positional scheme, choose what trains (peft), save."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import transformers

from .. import compat, loading
from ..errors import PosEncError, Unsupported
from ..patching import patch, validate
from .recipe import Recipe
from .tasks import TRAINING_TASKS

HEAD_MODULES = ("classifier", "score")  # peft's names for sequence-classification heads


def load_config(recipe: Recipe) -> transformers.PretrainedConfig:
    """The model's config alone (cheap), to check scheme support before any weights load."""
    try:
        return loading.load_config(recipe.model.model_name_or_path)
    except PosEncError as err:
        raise PosEncError(f"{recipe.source}: model_name_or_path: {err}") from None


def check_scheme(recipe: Recipe, config: transformers.PretrainedConfig) -> None:
    """A scheme the architecture does not take, or options it cannot resolve, are recipe errors, raised before
    loading weights (`hf_posenc.validate` on the config: an encoder-decoder's is read with its two stacks)."""
    if recipe.posenc.scheme is None:
        return
    try:
        validate(config, recipe.posenc.scheme, layers=recipe.posenc.scheme_layers, **recipe.posenc.scheme_options)
    except Unsupported as err:
        raise PosEncError(f"{recipe.source}: scheme: {config.model_type!r} does not support {err.scheme!r}; "
                          f"supported: {', '.join(err.supported) or 'none'}") from None
    except PosEncError as err:
        raise PosEncError(f"{recipe.source}: scheme{'_layers' if recipe.posenc.scheme_layers is not None else ''}: {err}") \
            from None


def load_recipe_model(recipe: Recipe) -> tuple[torch.nn.Module, Any]:
    """Model and tokenizer through `hf_posenc.loading`, with a pad token for batching."""
    m = recipe.model
    extra = {"num_labels": m.num_labels} if m.task == "classification" else {}
    model, tokenizer = loading.load(m.model_name_or_path, task=TRAINING_TASKS[m.task].head, tokenizer=m.tokenizer_name_or_path, dtype=getattr(torch, m.dtype),
                                    attn_implementation=m.attn_implementation, **extra)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def apply_posenc(model: torch.nn.Module, recipe: Recipe) -> set[str]:
    """Swap the scheme in place; return the names of the parameters the patch installed."""
    if recipe.posenc.scheme is None:
        return set()
    before = {id(p) for p in model.parameters()}
    patch(model, recipe.posenc.scheme, layers=recipe.posenc.scheme_layers, **recipe.posenc.scheme_options)
    return {name for name, p in model.named_parameters() if id(p) not in before}


def _group_names(model: torch.nn.Module, groups: list[str], posenc_names: set[str]) -> set[str]:
    names: set[str] = set()
    for mod_name, module in model.named_modules():
        kind = None
        if isinstance(module, torch.nn.Embedding):
            kind = "embeddings"
        elif isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("Norm"):
            kind = "norms"
        elif mod_name.split(".")[-1] in HEAD_MODULES:
            kind = "head"
        if kind in groups:
            names.update(f"{mod_name}.{n}" if mod_name else n for n, _ in module.named_parameters())
    if "posenc" in groups:
        names |= posenc_names
    return names


def select_trainable(model: torch.nn.Module, recipe: Recipe, posenc_names: set[str]) -> torch.nn.Module:
    """Full fine-tuning, or LoRA on the projections plus the configured groups trained in full.

    The groups are peft's `modules_to_save` (the modules owning their parameters, chosen on the bare model): peft
    trains a copy of each and saves it with the adapter, so a checkpoint and `--resume` hold them, the originals
    stay frozen (the distillation teacher shares them), and tied embeddings stay tied (`ensure_weight_tying`).
    """
    p, m = recipe.posenc, recipe.model
    if not m.use_peft:
        model.requires_grad_(True)
        return model
    import peft

    full = _group_names(model, p.trainable, posenc_names)
    patterns = [re.compile(rx) for rx in p.extra_trainable]
    full |= {n for n, _ in model.named_parameters() if any(rx.search(n) for rx in patterns)}
    owners = sorted({n.rpartition(".")[0] for n in full} | set(m.lora_modules_to_save or ()))
    owners = [o for o in owners if not any(o.startswith(f"{a}.") for a in owners)]  # a listed parent covers it
    config = peft.LoraConfig(  # TRL's `get_peft_config` fields, the groups trained in full added
        r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout, target_modules=m.lora_target_modules,
        target_parameters=m.lora_target_parameters, use_rslora=m.use_rslora, use_dora=m.use_dora,
        exclude_modules=[*(HEAD_MODULES if m.task == "classification" else ()), *owners] or None,
        modules_to_save=owners or None, ensure_weight_tying="embeddings" in p.trainable and _tied(model),
    )
    try:
        return compat.get_peft_model(model, config)
    except ValueError as err:
        raise PosEncError(f"{recipe.source}: lora_target_modules: {err}") from None


def _tied(model: torch.nn.Module) -> bool:
    """Whether the output head is the input embedding (SmolLM2): a copy trained of one must stay the other."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embedding is not None and head.weight is embedding.weight


def unsharded(recipe: Recipe, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The run's peft model as one plain module holding `state_dict`, the full weights gathered from
    FSDP shards. A sharded model can be neither merged nor unloaded in place (its parameters are
    DTensor shards), so it is built again as `train` built it, on this process: one more load of the
    model, next to the gathered weights."""
    model, _ = load_recipe_model(recipe)
    model = select_trainable(model, recipe, apply_posenc(model, recipe))
    model.load_state_dict(state_dict)  # strict: the same construction gives the same keys
    return model


def save_model(model: torch.nn.Module, tokenizer: Any, recipe: Recipe, out: Path,
               state_dict: dict[str, torch.Tensor] | None = None, *, sharded: bool = False) -> None:
    """Write the final model to `out`; it reloads with `hf_posenc.from_pretrained(out)`.

    LoRA is merged into the weights when `merge_lora`; otherwise `out` holds the base model
    (with the groups trained in full) and `out/adapter` the LoRA weights for peft. `state_dict`
    is the full-precision gathered copy of the weights; `sharded` says that `model` is sharded
    by FSDP, so that only `state_dict` holds whole tensors.
    """
    import peft

    if isinstance(model, peft.PeftModel):
        if sharded:
            model = unsharded(recipe, state_dict)
        if recipe.posenc.merge_lora:
            model = model.merge_and_unload()
        else:
            model.save_pretrained(out / "adapter")
            model = model.unload()
        state_dict = None  # the gathered keys are peft's; the merged/unloaded model holds the values
    model.save_pretrained(out, state_dict=state_dict)
    tokenizer.save_pretrained(out)
