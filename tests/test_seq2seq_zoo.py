"""The encoder-decoder zoo: speech models whose encoder is an audio tower (their text decoder is the stack
patched, found from the instance), and the seq2seq sweep (benchmarks/seq2seq_catalog.py), whose catalog, table,
`hf-posenc list` data and the support page's block must still be what the code does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import transformers

import hf_posenc as hp
import zoo
from hf_posenc.seq2seq import is_seq2seq, not_text, stack_module, text_stacks
from test_seq2seq import decoder_ids, logits


@pytest.mark.parametrize("model_type,auto", [("qwen2_audio", transformers.AutoModelForSeq2SeqLM),
                                              ("voxtral", transformers.AutoModelForSpeechSeq2Seq),
                                              ("granite_speech", transformers.AutoModelForSpeechSeq2Seq),
                                              ("speech_to_text", transformers.AutoModelForSpeechSeq2Seq)])
def test_a_speech_models_text_decoder_is_the_stack_patched(model_type, auto, tmp_path):
    """Speech models whose encoder is an audio tower (no token table: discovered, not named), be it an
    encoder-decoder model or a speech LM (a tower feeding a decoder-only Qwen2 / Llama / Granite LM, reached
    through get_decoder()): a patch takes the text decoder alone, moves the logits, leaves the tower's weights,
    reloads bit-identical (Qwen2-Audio's checkpoint keys are renamed on save) and unpatch gives the logits back
    bit for bit."""
    torch.manual_seed(0)
    model = auto.from_config(zoo.tiny_config(model_type)).eval()
    assert is_seq2seq(model) and text_stacks(model) == ("decoder",)
    assert "has no token embedding table" in not_text(model, "encoder")
    inputs = {"input_ids": decoder_ids(length=10)} if model.main_input_name == "input_ids" else \
        {"input_features": torch.randn(2, 32, model.config.input_feat_per_channel,
                                       generator=torch.Generator().manual_seed(1)), "decoder_input_ids": decoder_ids()}
    stock = logits(model, **inputs)
    tower = {k: v.clone() for k, v in stack_module(model, "encoder").state_dict().items()}
    for scheme, options in (("alibi", {}), ("rope", {"theta": 500.0}), ("learned", {"init": "normal"})):
        hp.patch(model, scheme, **options)
        assert hp.describe(model).stacks == ("decoder",)
        assert (logits(model, **inputs) - stock).abs().max() > 1e-3, scheme
        state = stack_module(model, "encoder").state_dict()
        assert state.keys() == tower.keys() and all(torch.equal(tower[k], v) for k, v in state.items())
    with pytest.raises(hp.PosEncError, match=r"the encoder stack is out of scope \(.* has no token embedding table"):
        hp.patch(model, "rope", stacks=("encoder",))
    assert hp.describe(model).scheme == "learned"
    patched = logits(model, **inputs)
    model.save_pretrained(tmp_path)
    for reloaded in (hp.from_pretrained(str(tmp_path), model_cls=auto),
                     auto.from_pretrained(str(tmp_path), trust_remote_code=True)):
        assert hp.describe(reloaded) == hp.describe(model)
        assert torch.equal(logits(reloaded.eval(), **inputs), patched)
    hp.unpatch(model)
    assert torch.equal(logits(model, **inputs), stock)


# ---------------------------------------------------------------- the seq2seq sweep (benchmarks/seq2seq_catalog.py)

ROOT = Path(__file__).parents[1]
_SPEC = importlib.util.spec_from_file_location("seq2seq_catalog", ROOT / "benchmarks" / "seq2seq_catalog.py")
SWEEP = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(SWEEP)
CATALOG = json.loads(SWEEP.OUT.read_text())
SLOW_TYPES = {"vibevoice", "vibevoice_asr"}  # ~1 min to build and run tiny


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=[pytest.mark.slow] if t in SLOW_TYPES else [])
                                        for t, row in CATALOG.items() if row["status"] != "no-build"])
def test_each_types_stacks_and_verdict_match_the_sweep(model_type):
    """The code still says what the sweep recorded: the stacks a patch takes and which sites they take."""
    row = CATALOG[model_type]
    stacks, why = SWEEP.verdict(SWEEP.build(model_type))
    assert (stacks, {site: reason is None for site, reason in why.items()}) == (row["stacks"], row["sites"])


def test_support_table_list_and_readme_are_the_seq2seq_sweep():
    assert sorted(CATALOG) == sorted(SWEEP.AUTO)
    assert SWEEP.TABLE.read_text() == SWEEP.table(CATALOG)
    assert json.loads(SWEEP.SHIPPED.read_text()) == SWEEP.shipped(CATALOG)
    prose, table = SWEEP.readme_block(CATALOG).split("\n\n", 1)
    assert table == SWEEP.table(CATALOG)  # the page includes the file: docs/support.md
    page = (ROOT / "docs" / "support.md").read_text()
    assert prose in page and '<!-- posenc:include benchmarks/results/seq2seq_support.md -->' in page, "rerun benchmarks/seq2seq_catalog.py"
