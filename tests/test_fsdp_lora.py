"""FSDP + LoRA: a patched peft model sharded with FSDP2 trains as the unsharded one and saves a model
that reloads patched.

accelerate picks FSDP only on an accelerator, so this runs the part that can break on the CPU: the
recipe's own model (`modeling.load_recipe_model` -> `apply_posenc` -> `select_trainable`: LoRA plus
the scheme's modules, embeddings, norms and head trained in full), wrapped with torch's `fully_shard`
per decoder layer as accelerate's TRANSFORMER_BASED_WRAP does, on 2 CPU processes over gloo, saved
from the gathered full state dict through `modeling.save_model(..., sharded=True)` as the runner does.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_eval_distributed import torchrun
from test_train import recipe_dict, tiny_assets, write_recipe

import hf_posenc
from hf_posenc.patching import describe_modules

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fsdp_lora")]  # one worker builds the module fixture

# scheme -> architecture: learned score biases (t5, kerple), a fixed one (alibi), a q/k rotation
# installed by hooks on a model that had none (rope on GPT-2, whose LoRA wraps Conv1D layers)
SCHEMES = {"t5": "llama", "kerple": "gpt2", "alibi": "llama", "rope": "gpt2"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The same recipes trained 3 steps on one process and sharded on two; their reports and folders."""
    import distributed_worker

    root = tmp_path_factory.mktemp("fsdp")
    assets = {arch: tiny_assets(root / arch, arch) for arch in set(SCHEMES.values())}
    recipes: dict[str, list[str]] = {"one": [], "two": []}
    for scheme, arch in SCHEMES.items():
        for run in recipes:
            data = recipe_dict(assets[arch], root / run / scheme, scheme=scheme, max_steps=3,
                               global_batch_size=4, per_device_train_batch_size=2, learning_rate=1e-2)
            recipes[run].append(str(write_recipe(root / f"{run}-{scheme}.yaml", data)))
    one = json.loads(json.dumps(distributed_worker.fsdp(0, 1, root / "one.json", recipes["one"])))
    proc = torchrun(["fsdp", str(root / "two.json"), *recipes["two"]], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"one": one, "two": json.loads((root / "two.json").read_text()), "root": root, "assets": assets}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_sharded_lora_trains_as_unsharded(runs, scheme):
    one, two = runs["one"][scheme], runs["two"][scheme]
    assert runs["two"]["world"] == 2 and two["sharded"] > 0 and one["sharded"] == 0  # DTensor shards, on 2 processes
    torch.testing.assert_close(torch.tensor(two["losses"]), torch.tensor(one["losses"]), rtol=1e-5, atol=1e-6)
    assert two["losses"][-1] < two["losses"][0]
    # gathered, rebuilt unsharded, merged and saved: the unsharded run's model, patched
    reloaded = hf_posenc.from_pretrained(str(runs["root"] / "two" / scheme))
    reference = hf_posenc.from_pretrained(str(runs["root"] / "one" / scheme))
    assert hf_posenc.describe(reloaded).scheme == scheme
    weights, expected = reloaded.state_dict(), reference.state_dict()
    assert weights.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_the_saved_model_gives_the_trained_models_logits(runs, scheme):
    two = runs["two"][scheme]
    reloaded = hf_posenc.from_pretrained(str(runs["root"] / "two" / scheme)).eval()
    with torch.no_grad():
        logits = reloaded(input_ids=torch.tensor(two["probe"])).logits
    # the sharded model's own logits before the save (LoRA merged on saving: rounding only; 1.2e-5 seen on one of
    # 8192 logits for t5, relative 8e-5)
    torch.testing.assert_close(logits, torch.tensor(two["logits"]), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("scheme", ["t5", "kerple"])  # the schemes here with weights of their own
def test_the_schemes_own_modules_are_trained_under_fsdp(runs, scheme):
    """A learned bias that FSDP or peft left frozen would reload with its initial values."""
    model_dir = str(runs["assets"][SCHEMES[scheme]]["model"])
    torch.manual_seed(0)
    fresh = describe_modules(hf_posenc.patch(hf_posenc.from_pretrained(model_dir), scheme))
    trained = describe_modules(hf_posenc.from_pretrained(str(runs["root"] / "two" / scheme)))
    assert len(fresh) == len(trained) == 1
    for name, value in fresh[0].state_dict().items():
        assert (trained[0].state_dict()[name] - value).abs().max() > 1e-3, name
