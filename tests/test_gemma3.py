"""Gemma3-270M, a real pretrained model with two kinds of layers (sliding-window, theta 1e4; global,
theta 1e6), read by the generic adapter: YaRN through the plug-in is transformers' own YaRN on both
layer types, and other schemes come and go bit-exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_posenc as hp
from hf_posenc import data, evaluation, loading

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gemma3")]  # one worker builds the module fixture

LAYER_TYPES = ("sliding_attention", "full_attention")
# The output head over a 262k-token vocabulary costs most of a forward: score the last 100 tokens, which attend to all 600.
KEEP = 100


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, logits_to_keep=KEEP).logits


@pytest.fixture(scope="module")
def gemma3():
    model, tokenizer = loading.load("gemma3-270m", dtype=torch.float32)
    # past the 512-token sliding window, so the two layer types attend differently
    ids = evaluation.text_token_ids(tokenizer, data.long_text("kjv"), 600)[None]
    return model, ids, logits(model, ids)


def test_the_model_has_both_layer_types_with_their_own_theta(gemma3):
    model, _, _ = gemma3
    rope = model.config.rope_parameters
    assert set(model.config.layer_types) == set(LAYER_TYPES) and model.config.sliding_window == 512
    assert rope["sliding_attention"]["rope_theta"] == 1e4 and rope["full_attention"]["rope_theta"] == 1e6


def test_yarn_equals_transformers_own_yarn_on_both_layer_types(gemma3):
    """The reference is the stock Gemma3 class built from a config whose rope_parameters ask for YaRN
    x2 (as a user would write it), with the same weights."""
    model, ids, original = gemma3
    config = copy.deepcopy(model.config)
    config.quantization_config = None  # the dequantized weights are plain tensors
    trained = config.max_position_embeddings
    config.rope_parameters = {t: {"rope_type": "yarn", "rope_theta": config.rope_parameters[t]["rope_theta"],
                                  "factor": 2.0, "original_max_position_embeddings": trained} for t in LAYER_TYPES}
    config.max_position_embeddings = 2 * trained
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    reference.load_state_dict(model.state_dict())
    hp.patch(model, "yarn", factor=2.0)
    try:
        assert {model.config.rope_parameters[t]["rope_type"] for t in LAYER_TYPES} == {"yarn"}
        patched, expected = logits(model, ids), logits(reference, ids)
    finally:
        hp.unpatch(model)
    assert not torch.allclose(expected, original, atol=1e-3)  # YaRN x2 moves the logits
    torch.testing.assert_close(patched, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["alibi", "nope"])
def test_patch_and_unpatch_are_bit_exact(gemma3, scheme):
    model, ids, original = gemma3
    patched = logits(hp.patch(model, scheme), ids)
    restored = logits(hp.unpatch(model), ids)
    assert not torch.allclose(patched, original, atol=1e-2)
    assert torch.equal(restored, original) and hp.describe(model) is None
