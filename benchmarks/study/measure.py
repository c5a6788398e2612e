"""What the study measures on a trained run: same-target perplexity and passkey at 1x/2x/4x the
training length, and, for arms that add positions to token embeddings, the position-vs-token subspace
geometry and the four-term split of layer-0 attention at checkpoints through training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from hf_posenc import analysis, evaluation
from hf_posenc.train import modeling
from hf_posenc.train.recipe import Recipe

from settings import Settings


def held_out_ids(tokenizer: Any, text: str, fraction: float) -> torch.Tensor:
    """The held-out tail of the token stream, cut where the recipe runner cuts it."""
    ids = evaluation.text_token_ids(tokenizer, text)
    return ids[int(ids.numel() * (1 - fraction)) :]


def length_metrics(model: torch.nn.Module, tokenizer: Any, ids: torch.Tensor, s: Settings,
                   batch_size: int = 1) -> dict[str, Any]:
    """Perplexity of the same target tokens (`batch_size` windows at a time) and passkey accuracy at 1x, 2x and
    4x the training length."""
    lengths = [s.seq_len, 2 * s.seq_len, 4 * s.seq_len]
    ppl = evaluation.perplexity_by_length(model, ids, lengths, batch_size=batch_size, max_windows=s.windows,
                                          target=s.target)
    keys = evaluation.passkey(model, tokenizer, lengths, depths=(0.5,), trials=s.passkey_trials)
    return {"perplexity": {str(k): v for k, v in ppl.items()}, "passkey": {str(k): v for k, v in keys.items()}}


def geometry(model: torch.nn.Module, ids: torch.Tensor, seq_len: int) -> dict[str, Any]:
    """Energy share and principal angles of the position subspace in the token subspace (vs random
    subspaces), and the layer-0 four-term shares (softmax-relevant, mean over heads) on held-out text."""
    return analysis.added_positions(model, ids[None, :seq_len], seq_len)


def encoding(model: torch.nn.Module, seq_len: int) -> dict[str, Any]:
    """The seed's other two questions on the trained position code: how linear a shift of it is (R^2 of
    PE(p+k) ~ M_k PE(p) against k, and the random-table chance level), and where its variation sits
    along the token embedding's singular directions (top vs bottom quarter; uniform is 0.25 each)."""
    positions = analysis.position_vectors(model, seq_len)
    fit = analysis.shift_fit(positions)
    energy = analysis.energy_by_direction(positions, analysis.token_vectors(model))
    quarters = analysis.quarter_shares(energy["per_token_direction"]["variation"])
    return {"offsets": fit["offsets"], "r2": fit["r2"], "random_r2": fit["random_r2"], "rank": fit["rank"],
            "variation_top_token_quarter": quarters["first_quarter"],
            "variation_bottom_token_quarter": quarters["last_quarter"]}


def checkpoint_model(recipe: Recipe, checkpoint: Path | None) -> torch.nn.Module:
    """The run's model as built by the runner (init weights, patch applied), with a checkpoint's weights
    (None: at initialisation)."""
    model, _ = modeling.load_recipe_model(recipe)
    modeling.apply_posenc(model, recipe)
    if checkpoint is not None:
        missing, unexpected = model.load_state_dict(load_file(checkpoint / "model.safetensors"), strict=False)
        tied = {"lm_head.weight"}  # saved once, as the input embedding
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"{checkpoint}: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
    return model.eval()
