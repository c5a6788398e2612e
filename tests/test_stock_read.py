"""A patched model is read as it was before its patch from what the patch kept (`view.StockRead` on its
`PatchState`), never by taking the patch off (issue 58); the stock modules a patch took out follow the model
through `.to()` / `.double()` / `.half()`, so `unpatch` and a re-patch after a conversion are exact."""

from __future__ import annotations

import copy
import dataclasses
import io

import pytest
import torch
import transformers

import hf_posenc
from hf_posenc import tiny, tiny_seq2seq, view
from hf_posenc.catalog import supported_schemes
from hf_posenc.state import STATE_ATTR, PatchState

# one model per way a patch takes stock modules out: a learned table (GPT-2's wpe), a rotary module (Llama's),
# a bucket table (T5's, in each of two stacks)
MODELS = {
    "gpt2": lambda: tiny.tiny_model("gpt2", transformers.AutoModelForCausalLM),
    "llama": lambda: tiny.tiny_model("llama", transformers.AutoModelForCausalLM),
    "t5": lambda: tiny_seq2seq.tiny_model("t5"),
}


def _logits(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    ids = torch.arange(3, 19).reshape(2, 8) % model.config.vocab_size
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            return model(input_ids=ids, decoder_input_ids=ids[:, :5]).logits
        return model(ids).logits


@pytest.fixture(params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[request.param]().eval()


def test_reading_a_patched_model_never_takes_its_patch_off(model, monkeypatch):
    """Everything that reads a patched model (its view, its stock stacks, a plan through `validate`, the schemes it
    takes) answers as for the stock model while the patch's `rollback` is made to fail."""
    stock_view = view.read(model)
    stock_facts = [s.facts for s in view.stock(model, stock_view, stock_view.text)]
    stock_schemes = supported_schemes(model)
    hf_posenc.patch(model, "alibi")

    def refuse(self):
        raise AssertionError("a read took the patch off")

    monkeypatch.setattr(PatchState, "rollback", refuse)
    read = view.read(model)
    assert [(s.name, s.adapter) for s in read.stacks] == [(s.name, s.adapter) for s in stock_view.stacks]
    facts = [s.facts for s in view.stock(model, read, read.text)]
    for got, want in zip(facts, stock_facts, strict=True):
        for field in dataclasses.fields(got):
            a, b = getattr(got, field.name), getattr(want, field.name)
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, field.name
    assert supported_schemes(model) == stock_schemes
    assert hf_posenc.validate(model, "rope").scheme == "rope"
    assert hf_posenc.describe(model).scheme == "alibi"


def test_kept_facts_hold_no_tensors(model):
    """The kept read holds modules, not copies of their tensors: a `deepcopy` of a patched model copies each table
    once, and a table trained or moved since is read as it is now."""
    hf_posenc.patch(model, "rope")
    kept = getattr(model, STATE_ATTR).stock
    assert kept.stacks and all(s.facts.position_table is None and s.facts.token_embeddings is None
                               and s.facts.bias_table is None for s in kept.stacks)
    twin = copy.deepcopy(model)
    embeddings = twin.get_input_embeddings().weight
    read = view.stock(twin, view.read(twin), view.read(twin).text)
    assert all(s.facts.token_embeddings.data_ptr() == s.module.get_input_embeddings().weight.data_ptr()
               for s in read)
    assert any(s.facts.token_embeddings.data_ptr() == embeddings.data_ptr() for s in read)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "nope"])
def test_unpatch_after_a_conversion_is_the_stock_model_converted(model, scheme):
    """`.double()` on a patched model converts the stock modules its patch holds too: `unpatch` then gives the stock
    model's float64 logits bit for bit (before, GPT-2's wpe came back float32 and the forward failed)."""
    want = _logits(copy.deepcopy(model).double())
    hf_posenc.patch(model, scheme)
    model.double()
    hf_posenc.unpatch(model)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert torch.equal(_logits(model), want)


def test_a_re_patch_after_a_conversion_reads_the_tables_as_they_are_now(model):
    """After `.double()`, a re-patch reads the stock facts in float64 (the tables' dtype now), and gives the logits
    of the same patch made on the stock model converted first."""
    twin = copy.deepcopy(model).double()
    hf_posenc.patch(twin, "rope")
    want = _logits(twin)
    hf_posenc.patch(model, "alibi")
    model.double()
    facts = view.stock(model, view.read(model), view.read(model).text)
    assert {s.facts.dtype for s in facts} == {torch.float64}
    assert {s.facts.token_embeddings.dtype for s in facts} == {torch.float64}
    hf_posenc.patch(model, "rope")
    assert torch.equal(_logits(model), want)


def test_a_state_pickled_before_patches_kept_their_read(model):
    """A patched model saved with `torch.save` before states kept a stock read (no `stock` in the pickle) loads,
    is read once with its patch off, keeps that read, and re-patches exactly."""
    hf_posenc.patch(model, "alibi")
    want = _logits(model)
    del getattr(model, STATE_ATTR).__dict__["stock"]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert getattr(loaded, STATE_ATTR).stock is None
    assert torch.equal(_logits(loaded), want)
    assert hf_posenc.validate(loaded, "rope").scheme == "rope"
    assert getattr(loaded, STATE_ATTR).stock is not None
    assert torch.equal(_logits(loaded), want)
    hf_posenc.patch(loaded, "rope")
    hf_posenc.patch(loaded, "alibi")
    assert torch.equal(_logits(loaded), want)


def test_every_hand_written_adapter_pickles():
    """A patched model's `torch.save` holds its adapters (in the kept stock read): each registered one pickles and
    reads back equal (RoBERTa's offset was a lambda, and `torch.save` of a patched RoBERTa failed)."""
    import pickle

    from hf_posenc.adapters.base import ADAPTERS

    for model_type, adapter in ADAPTERS.items():
        assert pickle.loads(pickle.dumps(adapter)) == adapter, model_type
