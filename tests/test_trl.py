"""TRL: SFTTrainer on patched models -- padding-free packed batches give the padded batches' loss, LoRA
trains the scheme's own modules, the result saves and reloads patched, and the docs' recipe runs."""

from __future__ import annotations

import datasets
import pytest
import torch
from peft import LoraConfig, PeftModel
from trl import SFTConfig, SFTTrainer

import hf_posenc
from conftest import tiny_model
from hf_posenc.integrations.lora import modules_to_save
from integration_support import DOC, char_tokenizer, doc_blocks, randomize_scheme_weights, save_tiny

# Four examples (one batch): the longest, with its eos, fills the tiny models' 64 positions.
TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "Jesus wept.",
    "And God called the light Day, and the darkness he called Night.",
]
def sft_config(tmp_path, **kwargs) -> SFTConfig:
    return SFTConfig(output_dir=str(tmp_path / "sft"), max_length=None, per_device_train_batch_size=len(TEXTS),
                     bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, seed=0, **kwargs)


def patched(model_type: str, scheme: str) -> torch.nn.Module:
    return randomize_scheme_weights(hf_posenc.patch(tiny_model(model_type), scheme))


def token_ids(text: str) -> torch.Tensor:
    return torch.tensor([char_tokenizer()(text)["input_ids"]])


@pytest.mark.parametrize("model_type,scheme", [
    ("llama", "alibi"),
    ("gpt2", "rope"),
    ("gpt2", "learned"),  # absolute: positions must restart at every example
    ("llama", "t5"),
    ("llama", "kerple"),
    ("gpt2", "fire"),
    ("llama", "untied"),
    ("llama", "self_extend"),
])
def test_padding_free_batches_give_the_padded_loss(tmp_path, model_type, scheme):
    train = datasets.Dataset.from_dict({"text": TEXTS})
    trainers = {
        padding_free: SFTTrainer(model=patched(model_type, scheme), train_dataset=train,
                                 args=sft_config(tmp_path, padding_free=padding_free),
                                 processing_class=char_tokenizer())
        for padding_free in (False, True)
    }
    padded = next(iter(trainers[False].get_train_dataloader()))
    packed = next(iter(trainers[True].get_train_dataloader()))
    # the same four examples: one flattened row whose position_ids restart at each of them
    rows = sorted(ids[mask.bool()].tolist() for ids, mask in zip(padded["input_ids"], padded["attention_mask"]))
    starts = [*packed["position_ids"][0].eq(0).nonzero().flatten().tolist(), packed["input_ids"].shape[1]]
    assert sorted(packed["input_ids"][0, a:b].tolist() for a, b in zip(starts, starts[1:])) == rows

    # TRL's loss on each trainer's first batch, per predicted token. (The Trainer's logged loss would not do:
    # for GPT2LMHeadModel, whose loss_type transformers leaves unset, it divides a padded batch's summed loss
    # by the labels before the shift, one per row too many.)
    with torch.no_grad():
        losses = {pf: trainer.compute_loss(trainer.model, batch).item()
                  for (pf, trainer), batch in zip(trainers.items(), (padded, packed))}
        # the same row read as one sequence (a 2-D mask hides the restarts) gives another loss
        crossing = trainers[True].compute_loss(trainers[True].model,
                                               {**packed, "attention_mask": torch.ones_like(packed["input_ids"])}).item()
    assert abs(crossing - losses[True]) > 1e-3
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)


@pytest.mark.parametrize("model_type,scheme,targets", [
    ("gpt2", "learned", ["c_attn"]),
    ("llama", "t5", ["q_proj", "v_proj"]),
])
def test_sft_lora_trains_the_scheme_modules_and_reloads_patched(tmp_path, model_type, scheme, targets):
    model = patched(model_type, scheme)
    base = save_tiny(tmp_path / "base", model=model)  # the patched base an adapter sits on
    names = modules_to_save(model)
    assert names, f"{scheme} installs weights of its own"
    before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith(tuple(f"{n}." for n in names))}
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, modules_to_save=names)
    trainer = SFTTrainer(model=model, args=sft_config(tmp_path, max_steps=3, learning_rate=5e-2),
                         train_dataset=datasets.Dataset.from_dict({"text": TEXTS}), processing_class=char_tokenizer(),
                         peft_config=config)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    ids = token_ids(TEXTS[0])
    trained = trainer.model.eval()
    with torch.no_grad():
        logits = trained(ids).logits
        adapter = PeftModel.from_pretrained(hf_posenc.from_pretrained(str(base)), str(tmp_path / "adapter")).eval()
        assert torch.allclose(adapter(ids).logits, logits, atol=1e-5)  # base reloaded patched + the saved adapter

    merged = trained.merge_and_unload()
    after = merged.state_dict()
    assert all(not torch.equal(after[k], v) for k, v in before.items()), "the scheme's own weights were not trained"
    assert hf_posenc.describe(merged) == hf_posenc.describe(adapter.get_base_model())
    merged.save_pretrained(tmp_path / "merged")
    reloaded = hf_posenc.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, logits, atol=1e-4)
        assert torch.equal(reloaded(ids).logits, merged(ids).logits)


def test_docs_recipe_runs_on_a_tiny_model(tmp_path, monkeypatch):
    (code,) = doc_blocks("TRL", "python")
    base = save_tiny(tmp_path / "base")  # a Llama, like SmolLM2
    substitutions = {'"HuggingFaceTB/SmolLM2-135M"': repr(str(base)), "max_steps=200": "max_steps=2",
                     "max_length=512": "max_length=128", "per_device_train_batch_size=8": "per_device_train_batch_size=2"}
    for old, new in substitutions.items():
        assert code.count(old) == 1, f"the docs' recipe changed: {old} not found once"
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    trainer, merged, reloaded = namespace["trainer"], namespace["merged"], namespace["reloaded"]
    assert trainer.padding_free and trainer.state.global_step == 2
    # describe gives the resolved options: a Llama has no ALiBi of its own, so the slopes keep scale 1
    assert hf_posenc.describe(reloaded) == hf_posenc.describe(merged) == hf_posenc.PosEncConfig("alibi", scale=1.0)
    ids = token_ids(TEXTS[0])
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(ids).logits, merged.eval()(ids).logits)
