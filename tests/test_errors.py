"""Bad input gets a PosEncError naming what was wrong and what is allowed; nothing is lost."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_posenc as hp
from conftest import tiny_model


@pytest.mark.parametrize(
    "scheme,options,message",
    [
        ("rotary", {}, r"unknown scheme 'rotary'; available schemes: alibi, .*rope"),
        ("rope", {"theta": 0.0}, r"scheme 'rope': theta must be a number > 0 or null, got 0.0"),
        ("rope", {"theta": -5}, r"theta must be a number > 0 or null, got -5"),
        ("rope", {"partial": 0.0}, r"partial must be a number in \(0, 1\] or null, got 0.0"),
        ("rope", {"partial": 1.5}, r"partial must be a number in \(0, 1\] or null, got 1.5"),
        ("yarn", {"factor": 0.5}, r"factor must be a number >= 1, got 0.5"),
        ("yarn", {}, r"option 'factor' is required"),
        ("rope", {"factr": 2.0}, r"scheme 'rope' has no option 'factr'; it takes: theta, partial"),
        ("alibi", {"theta": 1.0}, r"scheme 'alibi' has no option 'theta'; it takes: max_bias"),
        ("learned", {"init": "random"}, r"init must be one of \('copy', 'interpolate'"),
        ("nope", {"x": 1}, r"scheme 'nope' has no option 'x'; it takes: no options"),
        ("concat", {}, r"option 'd_pos' is required \(an int >= 0\)"),
        ("concat", {"d_pos": -1}, r"d_pos must be an int >= 0, got -1"),
        ("concat", {"d_pos": 8, "code": "rope"}, r"code must be one of \('sinusoidal', 'learned'\)"),
        ("kerple", {"variant": "power", "r2": 3.0}, r"power variant needs r2 <= 2"),
        ("t5", {"num_buckets": 2}, r"num_buckets must be an int >= 4"),
    ],
)
def test_bad_scheme_or_option(scheme, options, message):
    with pytest.raises(hp.PosEncError, match=message):
        hp.PosEncConfig(scheme, **options)
    model = tiny_model("gpt2")
    with pytest.raises(hp.PosEncError, match=message):
        hp.patch(model, scheme, **options)
    assert hp.describe(model) is None


def test_unsupported_architecture_names_what_the_generic_adapter_cannot_place():
    # GPT-J up to transformers 5.23 keeps its rotation table as a buffer inside each attention module, where no
    # site reaches; 5.24 moved it to one model-level rotary module that ignores rope_parameters: RoPE is refused by
    # name there (a rebuild would keep the stock rotation), other sites reach the attention
    config = transformers.GPTJConfig(vocab_size=64, n_embd=32, n_layer=1, n_head=4, rotary_dim=4,
                                     initializer_range=0.2)
    model = transformers.GPTJForCausalLM(config).eval()
    if hasattr(model.transformer, "rotary_emb"):
        x = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
        stock = model(x).logits
        with pytest.raises(hp.PosEncError, match=r"cannot take scheme 'rope' .*GPTJRotaryEmbedding\(config\) ignores "
                                                 r"rope_parameters"):
            hp.patch(model, "rope")
        assert torch.equal(model(x).logits, stock)
        hp.patch(model, "alibi")
        assert (model(x).logits - stock).abs().max() > 1e-2  # a swap reaches the attention
        return
    with pytest.raises(hp.PosEncError, match=r"'gptj': positions enter where .*buffer h\.0\.attn\.embed_positions"):
        hp.patch(model, "rope")
    assert not hp.supports(model, "rope")


def test_encoder_decoder_models_go_stack_by_stack_and_one_adapter_is_refused_with_the_reason():
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4))
    assert {"t5", "alibi", "rope", "nope"} <= set(hp.catalog.supported_schemes(model))
    with pytest.raises(hp.PosEncError, match=r"'t5' is an encoder-decoder model: its two stacks have an adapter each "
                                             r"\(hf_posenc.seq2seq.stack_adapter"):
        hp.catalog.adapter_for(model)
    with pytest.raises(hp.PosEncError, match=r"unsupported architecture 't5': no causal LM class .*AutoModelForCausalLM\.\)$"):
        hp.catalog.supported_schemes(model.config)


def test_unsupported_cell_names_the_schemes_this_model_takes():
    model = tiny_model("bert")
    # xPos decays with key-before-query distance: causal models only
    with pytest.raises(hp.PosEncError, match=r"'bert' models \(bert adapter\) cannot take scheme 'xpos' \('xpos' needs a causal model\); supported: alibi, .*nope.*rope.*yarn"):
        hp.patch(model, "xpos")
    assert hp.supports(model, "yarn") and not hp.supports(model, "xpos")


def test_concat_d_pos_must_leave_room_for_tokens():
    model = tiny_model("gpt2")
    with pytest.raises(hp.PosEncError, match=r"d_pos must be < the hidden size 64, got 64"):
        hp.patch(model, "concat", d_pos=64)
    assert hp.describe(model) is None


def test_config_from_a_newer_format_is_refused():
    with pytest.raises(hp.PosEncError, match=r"format 3, written by a newer hf-posenc.*format <= 2"):
        hp.PosEncConfig.from_dict({"format": 3, "scheme": "rope", "options": {}})
    assert hp.PosEncConfig.from_dict({"format": 1, "scheme": "rope", "options": {"theta": 5.0}}).options["theta"] == 5.0


def test_scheme_must_be_a_name_or_config():
    with pytest.raises(hp.PosEncError, match="scheme must be a name, a PosEncConfig or a layer map, got int"):
        hp.patch(tiny_model("gpt2"), 3)


def _snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, model.config.to_dict(),
            [type(m) for m in model.modules()])


@pytest.mark.parametrize("previous", [None, ("rope", {"theta": 100.0})])
def test_a_patch_failing_halfway_leaves_the_model_untouched(previous):
    model = tiny_model("gpt2")
    if previous:
        hp.patch(model, previous[0], **previous[1])
    x = torch.randint(3, 100, (1, 10))
    expected = model(x).logits
    before = _snapshot(model)
    # ALiBi needs a float bias, which flash/flex attention cannot take: the patch replaces the
    # position slot first and fails when it reaches the attention implementation.
    model.config._attn_implementation_internal = "flex_attention"
    with pytest.raises(hp.PosEncError, match=r"need attn_implementation 'sdpa' or 'eager', this model uses 'flex_attention'"):
        hp.patch(model, "alibi")
    model.config._attn_implementation_internal = "sdpa"
    after = _snapshot(model)
    assert before[1] == after[1] and before[2] == after[2]
    assert before[0].keys() == after[0].keys() and all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert torch.equal(model(x).logits, expected)
    assert hp.describe(model) == (hp.PosEncConfig(previous[0], **previous[1]).replace(partial=1.0) if previous else None)


def test_switching_attention_implementation_after_alibi():
    """transformers' names stay the model's: sdpa <-> eager switch with the scheme kept; one the scheme's term
    cannot go into is refused at the call, or, set on the config by hand, at the next forward."""
    model = hp.patch(tiny_model("llama"), "alibi")
    x = torch.randint(3, 100, (1, 5))
    assert model.config._attn_implementation == "sdpa"
    expected = model(x).logits
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(model(x).logits, expected)
    with pytest.raises(hp.PosEncError, match=r"attn_implementation 'flex_attention' cannot take .* 'sdpa', 'eager'"):
        model.set_attn_implementation("flex_attention")
    assert model.config._attn_implementation == "eager"
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(hp.PosEncError, match=r"switched to 'flex_attention' after patching, which cannot take the 'alibi'"):
        model(x)
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(model(x).logits, expected)
    hp.unpatch(model)
    assert "set_attn_implementation" not in vars(model)


def test_learned_table_limit_names_length_and_limit():
    model = hp.patch(tiny_model("bert"), "learned", max_positions=32)
    with pytest.raises(hp.PosEncError, match=r"needs position 39 \(length 40\) but the 'learned' table has 32 positions"):
        model(torch.randint(3, 100, (1, 40)))


def test_a_scheme_a_model_cannot_take_is_unsupported_with_its_parts():
    """`hp.Unsupported` (a PosEncError) carries what the CLI and recipes say their own way: the scheme, the reason and
    what the model takes; `validate` raises it for a config (an encoder-decoder's included) as `patch` does."""
    from transformers import BertConfig, T5Config

    with pytest.raises(hp.Unsupported) as caught:
        hp.validate(BertConfig(), "xpos")
    assert (caught.value.scheme, caught.value.reason) == ("xpos", "'xpos' needs a causal model")
    assert "alibi" in caught.value.supported and "xpos" not in caught.value.supported
    assert isinstance(caught.value, hp.PosEncError) and "supported: alibi" in str(caught.value)
    with pytest.raises(hp.Unsupported, match=r"'t5' cannot take scheme 'xpos' \(encoder: ") as caught:
        hp.validate(T5Config(num_layers=2, d_model=32, d_kv=8, d_ff=64, num_heads=4), "xpos")
    assert caught.value.scheme == "xpos" and "rope" in caught.value.supported
