"""hf_posenc.loading: the one loader. Package models by name, GGUF unpacked into a model that saves,
patched folders come back patched, the class follows the task, bad names fail fast and clearly."""

from __future__ import annotations

import logging
import time

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
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


@pytest.fixture
def load_reports():
    """The load reports transformers' logger emits (at its default verbosity, warnings): its handlers do not
    propagate to pytest's."""
    reports: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "LOAD REPORT" in record.getMessage():
                reports.append(record.getMessage())

    logger, handler, level = logging.getLogger("transformers"), Kept(), transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    logger.addHandler(handler)
    yield reports
    logger.removeHandler(handler)
    transformers.logging.set_verbosity(level)


def trained(model: torch.nn.Module) -> torch.nn.Module:
    """The patch's weights moved off any init, so only a load of them can give them back."""
    with torch.no_grad():
        for module in hp.patching.describe_modules(model):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    return model


def patch_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t for m in hp.patching.describe_modules(model) for t in m.state_dict().values()]


# (family, head class, scheme with trained weights, options): each base model <-> model with a head, both ways
BRIDGES = [("llama", "causal", "t5", {"init_std": 0.5}), ("gpt2", "causal", "fire", {"init": "random"}),
           ("bert", "masked", "t5", {"init_std": 0.5}), ("qwen3", "causal", "kerple", {}),
           ("mistral", "causal", "cope", {"init_std": 0.5}), ("roberta", "masked", "fire", {"init": "random"}),
           ("distilbert", "masked", "kerple", {})]


@pytest.mark.parametrize("arch,head,scheme,options", BRIDGES, ids=[f"{a}-{s}" for a, _, s, _ in BRIDGES])
def test_a_base_checkpoint_loads_into_a_head_class_and_a_head_checkpoint_into_the_base(
        arch, head, scheme, options, tmp_path, load_reports):
    x = torch.randint(3, 120, (2, 12), generator=torch.Generator().manual_seed(1))
    base = trained(hp.patch(tiny_model(arch, head="base"), scheme, **options))
    base.save_pretrained(tmp_path / "base")
    head_cls = type(tiny_model(arch, head=head))
    torch.manual_seed(7)
    loaded = hp.from_pretrained(str(tmp_path / "base"), model_cls=head_cls).eval()
    reports = list(load_reports)
    assert type(loaded) is head_cls and hp.describe(loaded) == hp.describe(base)
    assert all(torch.equal(a, b) for a, b in zip(patch_weights(loaded), patch_weights(base), strict=True))
    assert torch.equal(loaded.base_model(x).last_hidden_state, base(x).last_hidden_state)
    # the head's own weights are new: drawn as transformers' own load of the same checkpoint draws them, and said so
    torch.manual_seed(7)
    stock = head_cls.from_pretrained(str(tmp_path / "base"), config=loading.read_config(tmp_path / "base"))
    new = {k: v for k, v in stock.state_dict().items() if not k.startswith(f"{stock.base_model_prefix}.")}
    assert new and all(torch.equal(loaded.state_dict()[k], v) for k, v in new.items())
    untied = [k for k in new if k not in stock.all_tied_weights_keys]  # GPT-2's head: its tied input embeddings
    assert len(reports) == bool(untied) and all("newly initialized" in r and "posenc" not in r for r in reports)
    assert all(k in reports[0] for k in untied)

    with_head = trained(hp.patch(tiny_model(arch, head=head), scheme, **options))
    with_head.save_pretrained(tmp_path / "head")
    load_reports.clear()
    bare = hp.from_pretrained(str(tmp_path / "head"), model_cls=type(base)).eval()
    assert all(torch.equal(a, b) for a, b in zip(patch_weights(bare), patch_weights(with_head), strict=True))
    assert torch.equal(bare(x).last_hidden_state, with_head.base_model(x).last_hidden_state)
    assert all("posenc" not in report for report in load_reports)
    # weights truly missing are still refused (a documented departure): the patch's keys taken out of the file
    file = tmp_path / "base" / "model.safetensors"
    kept = {k: v for k, v in load_file(file).items() if "posenc" not in k}
    save_file(kept, file, metadata={"format": "pt"})
    with pytest.raises(PosEncError, match=f"lacks the weights of its '{scheme}' patch"):
        hp.from_pretrained(str(tmp_path / "base"), model_cls=head_cls)


def test_a_load_reports_what_transformers_reports_except_the_patchs_own_keys(tmp_path, load_reports):
    for name, model in [("fire", hp.patch(tiny_model("llama", head="cls"), "fire", init="random")),
                        ("nope", hp.patch(tiny_model("gpt2", head="cls"), "nope"))]:  # the stock table taken out
        model.save_pretrained(tmp_path / name)
        again = hp.from_pretrained(str(tmp_path / name), model_cls=type(model))
        assert hp.describe(again) == hp.describe(model)
    assert load_reports == []  # the patch's keys are the only ones transformers would report
    cls = transformers.AutoModelForSequenceClassification
    _, info = hp.from_pretrained(str(tmp_path / "fire"), model_cls=cls, num_labels=5, ignore_mismatched_sizes=True,
                                 output_loading_info=True)
    (report,) = load_reports
    assert "score.weight (Reinit due to size mismatch - ckpt: (2, 64) vs model: (5, 64))" in report
    assert "posenc" not in report and not info["unexpected_keys"] and not info["missing_keys"]
    assert [key for key, *_ in info["mismatched_keys"]] == ["score.weight"]
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # transformers' own report explains it
        hp.from_pretrained(str(tmp_path / "fire"), model_cls=cls, num_labels=5)
    assert len(load_reports) == 2 and "MISMATCH" in load_reports[1]
