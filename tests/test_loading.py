"""hf_posenc.loading: the one loader. Package models by name, GGUF unpacked into a model that saves,
patched folders come back patched, the class follows the task, bad names fail fast and clearly."""

from __future__ import annotations

import time

import pytest
import torch
import transformers
from conftest import tiny_model

import hf_posenc as hp
from hf_posenc import loading
from hf_posenc.errors import PosEncError


def test_a_patched_folder_loads_patched_with_the_class_of_its_task(tmp_path):
    model = hp.patch(tiny_model("bert", head="cls"), "rope")
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(1, 128, (1, 80))  # past the 64-row table: only the patch runs that far
    for task, cls in [("saved", transformers.BertForSequenceClassification),
                      ("classification", transformers.BertForSequenceClassification)]:
        loaded = loading.load_model(str(tmp_path / "m"), task=task)
        assert type(loaded) is cls and not loaded.training
        assert hp.describe(loaded) == hp.describe(model)
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, model(ids).logits)
    base = loading.load_model(str(tmp_path / "m"), task="base", scheme="alibi")
    assert type(base) is transformers.BertModel and hp.describe(base).scheme == "alibi"


def test_bad_names_and_tasks_fail_fast_naming_what_is_allowed(tmp_path):
    start = time.monotonic()
    with pytest.raises(PosEncError, match="is not a model folder, a Hub id .* or one of smollm2, minilm"):
        loading.load_model(str(tmp_path / "missing"))
    with pytest.raises(PosEncError, match="cannot load the config of 'no-such-user/no-such-model' \\(OSError"):
        loading.load_model("no-such-user/no-such-model")  # HF_HUB_OFFLINE: fails at once
    assert time.monotonic() - start < 10
    tiny_model("gpt2").save_pretrained(tmp_path / "gpt2")
    with pytest.raises(PosEncError, match="unknown task 'translation'; choose one of causal_lm, classification, masked_lm, seq2seq"):
        loading.load_model(str(tmp_path / "gpt2"), task="translation")


@pytest.mark.slow
def test_gguf_model_is_unpacked_into_one_that_saves_and_reloads_exactly(tmp_path):
    pytest.importorskip("gguf")
    model, tokenizer = loading.load("smollm2", dtype=torch.float32)
    assert type(model) is transformers.LlamaForCausalLM and getattr(model, "hf_quantizer", None) is None
    ids = tokenizer("In the beginning God created the heaven and the earth.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = model(ids).logits
    hp.patch(model, "nope").save_pretrained(tmp_path / "nope")
    hp.unpatch(model)
    reloaded = loading.load_model(str(tmp_path / "nope"), task="saved", dtype=torch.float32)
    assert hp.describe(reloaded).scheme == "nope"
    hp.unpatch(reloaded)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, expected)
