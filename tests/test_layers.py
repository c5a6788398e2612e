"""Per-layer patches (issue 30): a scheme in some layers, the model's own positions in the others, and maps of
several schemes. The invariant rows run the per-layer labels of matrix.py; here: a reference built by hand,
layers that cover the model equal to the whole-model patch on every family, independence of layers, bad maps
refused before any change, save -> reload and the plain Auto load of a map."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import hf_posenc as hp
import zoo
from conftest import tiny_model
from hf_posenc.catalog import adapter_for, supports
from matrix import ids


def by_hand(model: torch.nn.Module, x: torch.Tensor, rotations: dict[int, tuple[torch.Tensor, torch.Tensor]]
            ) -> torch.Tensor:
    """Llama's forward written out layer by layer (causal mask, no cache): layer i rotates q and k by
    `rotations[i]` if given, else by the model's own rotary module."""
    base = model.base_model
    hidden = base.embed_tokens(x)
    positions = torch.arange(x.shape[1])[None]
    own = base.rotary_emb(hidden, positions)
    mask = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu(1)[None, None]
    for i, layer in enumerate(base.layers):
        hidden = layer(hidden, attention_mask=mask, position_ids=positions,
                       position_embeddings=rotations.get(i, own))
    return model.lm_head(base.norm(hidden))


def rotation(model: torch.nn.Module, x: torch.Tensor, theta: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of transformers' own default RoPE at `theta` for positions 0..L-1; None: no rotation."""
    positions = torch.arange(x.shape[1])[None]
    config = copy.deepcopy(model.config)
    config.rope_parameters = {"rope_type": "default", "rope_theta": theta or 1e4}
    cos, sin = LlamaRotaryEmbedding(config)(model.base_model.embed_tokens(x), positions)
    return (torch.ones_like(cos), torch.zeros_like(sin)) if theta is None else (cos, sin)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_layer_without_rotation_equals_the_forward_built_by_hand(arch):
    """NoPE in layer 1: the same logits as the layers run by hand with layer 1's cos = 1, sin = 0."""
    model = tiny_model(arch)
    x = ids()
    with torch.no_grad():
        expected = by_hand(model, x, {1: rotation(model, x, None)})
        hp.patch(model, "nope", layers=[1])
        got = model(x).logits
        stock = hp.unpatch(model)(x).logits
    assert (expected - stock).abs().max() > 1e-2  # the reference sees the change
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_two_thetas_for_alternating_layers_equal_the_forward_built_by_hand():
    """Gemma 3's pattern as a map: RoPE theta 1e4 in layer 0, theta 1e6 in layer 1."""
    model = tiny_model("llama")
    x = ids()
    with torch.no_grad():
        expected = by_hand(model, x, {0: rotation(model, x, 1e4), 1: rotation(model, x, 1e6)})
        hp.patch(model, [hp.PosEncConfig("rope", theta=1e4, layers=[0]), hp.PosEncConfig("rope", theta=1e6, layers=[1])])
        got = model(x).logits
    assert isinstance(hp.describe(model), hp.LayerMap)
    assert [e.options["theta"] for e in hp.describe(model).entries] == [1e4, 1e6]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_patched_layer_leaves_the_layers_before_it_alone():
    model = tiny_model("llama")
    x = ids()
    with torch.no_grad():
        before = model(x, output_hidden_states=True).hidden_states
        after = hp.patch(model, "alibi", layers=[1])(x, output_hidden_states=True).hidden_states
    torch.testing.assert_close(after[1], before[1], atol=0, rtol=0)  # what layer 0 wrote
    assert (after[2] - before[2]).abs().max() > 1e-2


# every family of the zoo with a per-layer mechanism: native rotation (llama-like, partial rotary, per layer
# type), q/k taps on learned-table models, a native ALiBi bias per block (BLOOM), a bias switch (Falcon)
FAMILIES = ["gpt2", "gpt_neox", "phi", "stablelm", "bloom", "falcon", "opt", "gemma2", "olmo"]
SCHEMES = [("rope", {"theta": 300.0}), ("alibi", {}), ("nope", {}), ("xpos", {"scale_base": 16.0})]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_layers_covering_the_model_equal_the_whole_model_patch(model_type):
    """Every layer listed is the whole-model patch: the same logits on every family, for every site."""
    x = zoo.inputs()
    for scheme, options in SCHEMES:
        model = zoo.build(model_type)
        if not supports(model, scheme):
            continue
        layers = list(range(len(model.base_model.get_submodule(adapter_for(model).blocks.layers))))
        with torch.no_grad():
            whole = hp.patch(model, scheme, **options)(x).logits
            by_layers = hp.patch(model, scheme, layers=layers, **options)(x).logits
        torch.testing.assert_close(by_layers, whole, atol=1e-5, rtol=1e-5, msg=f"{model_type} {scheme}")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_one_layer_patched_is_cached_equal_to_uncached_and_unpatches_exactly(model_type):
    """The last layer patched, the others as they were: cache, stock attention in the other layers, unpatch."""
    model = zoo.build(model_type)
    x = zoo.inputs()
    with torch.no_grad():
        stock = model(x).logits
    last = len(model.base_model.get_submodule(adapter_for(model).blocks.layers)) - 1
    tried = 0
    for scheme, options in SCHEMES:
        try:
            hp.patch(model, scheme, layers=[last], **options)
        except hp.PosEncError as err:
            assert scheme in str(err)  # refused by name (a learned-table model has nothing to remove per layer)
            continue
        tried += 1
        with torch.no_grad():
            full = model(x).logits
            past = model(x[:, :-3], use_cache=True).past_key_values
            step = model(x[:, -3:], past_key_values=past, use_cache=True).logits
        torch.testing.assert_close(step, full[:, -3:], atol=1e-4, rtol=1e-4, msg=f"{model_type} {scheme}")
        assert torch.isfinite(full).all()
        with torch.no_grad():
            torch.testing.assert_close(hp.unpatch(model)(x).logits, stock, atol=0, rtol=0)
    assert tried >= 2


@pytest.mark.parametrize("patch,message", [
    (dict(scheme="nope", layers=[2]), r"layers \[2\] are not attention layers.*2 layers, attention layers 0-1"),
    (dict(scheme="nope", layers=[1, 1]), r"layer 1 more than once"),
    (dict(scheme="nope", layers=[]), r"non-empty list of layer indices"),
    (dict(scheme="nope", layers=[-1]), r"integers >= 0"),
    (dict(scheme="learned", layers=[0]), r"'learned' in layers \[0\].*token embeddings"),
    (dict(scheme={"nope": [0], "rope": [0, 1]}), r"layer 0 is in two entries"),
    (dict(scheme={"alibi": [0], "t5": [1]}), r"one scheme that runs in the attention function.*alibi.*t5"),
    (dict(scheme={"nope": [0], "rop": [1]}), r"unknown scheme 'rop'"),
    (dict(scheme={"nope": [0]}, theta=5.0), r"options in its entries"),
])
def test_bad_layers_are_refused_by_name_and_leave_the_model_as_it_was(patch, message):
    model = hp.patch(tiny_model("llama"), "yarn", factor=2.0)
    x = ids()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        logits = model(x).logits
    scheme = patch.pop("scheme")
    with pytest.raises(hp.PosEncError, match=message):
        hp.patch(model, scheme, **patch)
    assert hp.describe(model) == hp.PosEncConfig("yarn", factor=2.0).replace(**hp.describe(model).options)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, logits, atol=0, rtol=0)


def test_learned_table_models_refuse_nope_in_some_layers_but_take_it_in_a_map_covering_them():
    """GPT-2's positions enter at the input: NoPE in one layer would change nothing, so it is refused by name;
    a map over every layer replaces the table as the whole-model patch does."""
    model = tiny_model("gpt2")
    with pytest.raises(hp.PosEncError, match=r"nothing to remove.*enter at the input"):
        hp.patch(model, "nope", layers=[1])
    x = ids()
    with torch.no_grad():
        mixed = hp.patch(model, {"rope": [0], "nope": [1]})(x).logits
        rope_then_nope = hp.patch(tiny_model("gpt2"), "rope", layers=[0])(x).logits  # the table kept
    assert (mixed - rope_then_nope).abs().max() > 1e-2
    shifted = hp.patch(model, {"rope": [0], "nope": [1]})(x, position_ids=torch.arange(12)[None] + 5).logits
    torch.testing.assert_close(shifted, mixed, atol=1e-4, rtol=1e-4)  # no table left: only relative positions


@pytest.mark.parametrize("patch", [
    {"nope": [1]},
    [hp.PosEncConfig("rope", theta=1e4, layers=[0]), hp.PosEncConfig("alibi", layers=[1])],
])
def test_a_map_saved_reloads_and_loads_by_auto_with_remote_code(patch, tmp_path):
    model = hp.patch(tiny_model("llama"), patch)
    x = ids()
    with torch.no_grad():
        expected = model(x).logits
    model.save_pretrained(tmp_path)
    reloaded = hp.from_pretrained(str(tmp_path))
    auto = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert hp.describe(reloaded) == hp.describe(model) == hp.describe(auto)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, expected, atol=0, rtol=0)
        torch.testing.assert_close(auto(x).logits, expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="trust_remote_code"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_a_map_survives_deepcopy_torch_save_and_peft(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = hp.patch(tiny_model("llama"), {"nope": [0], "xpos": [1]})
    x = ids()
    with torch.no_grad():
        expected = model(x).logits
        torch.testing.assert_close(copy.deepcopy(model)(x).logits, expected, atol=0, rtol=0)
        torch.save(model, tmp_path / "m.pt")
        loaded = torch.load(tmp_path / "m.pt", weights_only=False)
        torch.testing.assert_close(loaded(x).logits, expected, atol=0, rtol=0)
        peft_model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "k_proj"], r=4))
        torch.testing.assert_close(peft_model(input_ids=x).logits, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("model_type", ["bart", "t5"])
def test_encoder_decoder_stacks_take_layers_in_each_stack(model_type, tmp_path):
    """The same layers in each stack; covering every layer is the whole-model patch. T5 computes its bias once
    per stack and shares it, so a patch of some of its layers is refused by name."""
    from seq2seq_models import encoder_inputs, tiny_seq2seq

    model = tiny_seq2seq(model_type)
    inputs = {**encoder_inputs(model), "decoder_input_ids": torch.randint(3, 50, (2, 6))}
    with torch.no_grad():
        whole = hp.patch(model, "alibi")(**inputs).logits
        torch.testing.assert_close(hp.patch(model, "alibi", layers=[0, 1])(**inputs).logits, whole, atol=1e-5, rtol=0)
    if model_type == "t5":
        with pytest.raises(hp.PosEncError, match=r"computes its own position bias once for every layer"):
            hp.patch(model, "alibi", layers=[1])
        assert hp.describe(model).layers == (0, 1)
        return
    hp.patch(model, "rope", layers=[1], theta=300.0)
    assert hp.describe(model).stacks == ("encoder", "decoder")
    with torch.no_grad():
        expected = model(**inputs).logits
        past = model(**{**inputs, "decoder_input_ids": inputs["decoder_input_ids"][:, :-2]}, use_cache=True)
        step = model(**{**inputs, "decoder_input_ids": inputs["decoder_input_ids"][:, -2:]},
                     past_key_values=past.past_key_values, use_cache=True).logits
    torch.testing.assert_close(step, expected[:, -2:], atol=1e-4, rtol=1e-4)
    model.save_pretrained(tmp_path)
    reloaded = hp.from_pretrained(str(tmp_path), model_cls=type(model))
    assert hp.describe(reloaded) == hp.describe(model)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, expected, atol=0, rtol=0)


MAPS = {
    "llama": {"nope": [0], "alibi": [1]},
    "qwen3": [hp.PosEncConfig("rope", theta=1e4, layers=[0]), hp.PosEncConfig("xpos", scale_base=16.0, layers=[1])],
    "gpt2": {"rope": [0], "nope": [1]},
    "mistral": [hp.PosEncConfig("p_rope", p=0.5, layers=[0]), hp.PosEncConfig("t5", init_std=0.5, layers=[1])],
}


@pytest.mark.parametrize("arch", sorted(MAPS))
def test_a_map_keeps_the_invariants(arch):
    """The invariant rows on maps of two schemes: cache, left padding, sdpa == eager, static cache generate."""
    model = hp.patch(tiny_model(arch), MAPS[arch])
    eager = hp.patch(tiny_model(arch, attn="eager"), MAPS[arch])
    eager.load_state_dict(model.state_dict())
    x = ids(batch=2, length=12)
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    with torch.no_grad():
        full = model(x, attention_mask=mask).logits
        torch.testing.assert_close(eager(x, attention_mask=mask).logits[1], full[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(eager(x, attention_mask=mask).logits[0, 3:], full[0, 3:], atol=1e-4, rtol=1e-4)
        alone = model(x[:1, 3:]).logits
        torch.testing.assert_close(full[0, 3:], alone[0], atol=1e-4, rtol=1e-4)  # left padding
        past = model(x[:, :-4], attention_mask=mask[:, :-4], use_cache=True).past_key_values
        step = model(x[:, -4:], attention_mask=mask, past_key_values=past, use_cache=True).logits
        torch.testing.assert_close(step, full[:, -4:], atol=1e-4, rtol=1e-4)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    dynamic = model.generate(x, attention_mask=mask, **kw)
    static = model.generate(x, attention_mask=mask, cache_implementation="static", **kw)
    assert torch.equal(dynamic, static)


def test_inspect_says_a_per_layer_patch_has_no_one_view(tmp_path):
    from hf_posenc.analysis.report import inspect_model

    model = hp.patch(tiny_model("llama"), {"nope": [0], "alibi": [1]})
    result = inspect_model(model, ids(batch=1), tmp_path)
    assert result["positions"] == "per-layer" and "LayerMap" in result["summary"]
    assert result["patched"]["map"][1]["layers"] == [1]
