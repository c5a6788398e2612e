"""BLOOM and Falcon: attention outside ALL_ATTENTION_FUNCTIONS, reached through hooks.

Score biases go into the mask their attention adds to its logits (`sites.score.BiasMask`), private kwargs
are carried past blocks called without **kwargs (`sites.base.CarryKwargs`), BLOOM's per-head packed
query_key_value is split by layout data, and Falcon's ALiBi is switched off where it is built. The zoo
cells (tests/test_zoo.py) cover the default BLOOM and Falcon configs; these add Falcon with alibi=True,
sdpa == eager, the mask itself, reload and gradient checkpointing (StableLM's relay included).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

import hf_posenc as hp
import zoo
from hf_posenc.adapters.base import QKTap
from hf_posenc.adapters.probes import source_has
from hf_posenc.patching import describe_modules
from hf_posenc.schemes.rotary import rotate
from hf_posenc.sites.qk import RotateOutput

SCORE_SCHEMES = ("alibi", "t5", "kerple", "fire")
# Falcon's three attention layouts: multi-query (the default), per-head packed, grouped key-value heads
FALCON_VARIANTS = {"multi_query": {}, "per_head": {"multi_query": False, "num_kv_heads": 4},
                   "kv_groups": {"new_decoder_architecture": True, "num_kv_heads": 2}}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def falcon(alibi: bool, variant: str = "multi_query", attn: str | None = None) -> torch.nn.Module:
    tiny = zoo.tiny_config("falcon")
    # built anew, as a config.json is read: from 5.25 the config derives its key-value heads from these fields
    values = {k: v for k, v in tiny.to_dict().items() if k != "num_key_value_heads"}
    config = type(tiny)(**{**values, "alibi": alibi, **FALCON_VARIANTS[variant]})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, **({"attn_implementation": attn} if attn else {})).eval()


def cached_logits(model: torch.nn.Module, x: torch.Tensor, prefix: int) -> torch.Tensor:
    cache = DynamicCache(config=model.config)
    steps = [zoo.logits(model, x[:, :prefix], past_key_values=cache, use_cache=True)]
    steps += [zoo.logits(model, x[:, t:t + 1], past_key_values=cache, use_cache=True) for t in range(prefix, x.shape[1])]
    return torch.cat(steps, dim=1)


def padded_row(model: torch.nn.Module, x: torch.Tensor, pad: int) -> torch.Tensor:
    batch = torch.cat((torch.cat((torch.zeros(1, pad, dtype=torch.long), x), dim=1), zoo.inputs(1, x.shape[1] + pad, 5)))
    mask = torch.ones_like(batch)
    mask[0, :pad] = 0
    return zoo.logits(model, batch, attention_mask=mask)[0, pad:]


@pytest.mark.parametrize("variant", FALCON_VARIANTS)
def test_falcon_alibi_is_its_own_scheme(variant):
    """Falcon's ALiBi divides the standard slopes by sqrt(head_dim): `alibi` with default options
    takes that scale and equals the stock model; unpatch is bit-exact."""
    model, x = falcon(True, variant), zoo.inputs()
    stock = zoo.logits(model, x)
    hp.patch(model, "alibi")
    assert hp.describe(model).options["scale"] == 16 ** -0.5
    torch.testing.assert_close(zoo.logits(model, x), stock, atol=1e-5, rtol=1e-4)
    hp.unpatch(model)
    assert torch.equal(zoo.logits(model, x), stock)


@pytest.mark.parametrize("variant", FALCON_VARIANTS)
def test_falcon_alibi_takes_other_schemes_with_its_alibi_off(variant):
    """Falcon builds ALiBi into the mask before its blocks and rotates only without it: the patch turns
    `use_alibi` off, so RoPE rotates, nope has no positions, and each differs from the others."""
    model, x = falcon(True, variant), zoo.inputs()
    stock = zoo.logits(model, x)
    out = {name: zoo.logits(hp.patch(model, name), x) for name in ("rope", "nope", "kerple")}
    assert model.base_model.use_alibi is False
    for a, b in (("rope", "nope"), ("rope", "kerple"), ("nope", "kerple")):
        assert not torch.allclose(out[a], out[b], atol=1e-3), (a, b)
    assert not torch.allclose(out["rope"], stock, atol=1e-3)
    hp.unpatch(model)
    assert model.base_model.use_alibi is True


@pytest.mark.parametrize("variant", FALCON_VARIANTS)
def test_rope_on_an_alibi_falcon_is_falcons_own_rope(variant):
    """The reference is transformers' own: an ALiBi Falcon patched with `rope` at the theta a RoPE Falcon uses equals
    that RoPE Falcon with the same weights, in every packing (from 5.25 the rotation is hf-posenc's, at the packed
    projection, with fewer key-value than query heads in the multi-query and kv_groups layouts)."""
    rope_model, x = falcon(False, variant), zoo.inputs(length=10)
    model = falcon(True, variant)
    model.load_state_dict(rope_model.state_dict())
    theta = rope_model.config.rope_parameters["rope_theta"]
    hp.patch(model, "rope", theta=theta)
    torch.testing.assert_close(zoo.logits(model, x), zoo.logits(rope_model, x), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cached_logits(model, x, 6), zoo.logits(rope_model, x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("alibi", [True, False])
@pytest.mark.parametrize("scheme", SCORE_SCHEMES)
def test_falcon_score_schemes_cache_and_left_padding(alibi, scheme):
    model, x = falcon(alibi), zoo.inputs(length=10)
    hp.patch(model, scheme)
    torch.testing.assert_close(cached_logits(model, x, 6), zoo.logits(model, x), atol=1e-4, rtol=1e-4)
    alone = zoo.logits(model, x[:1], attention_mask=torch.ones_like(x[:1]))[0]
    torch.testing.assert_close(padded_row(model, x[:1], 3), alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("alibi", [True, False])
@pytest.mark.parametrize("scheme", SCORE_SCHEMES)
def test_falcon_score_schemes_sdpa_equals_eager(alibi, scheme):
    """Stock Falcon with ALiBi differs between them (its eager path adds ALiBi twice); patched, both
    add the one biased mask."""
    x = zoo.inputs()
    sdpa, eager = (zoo.logits(hp.patch(falcon(alibi, attn=attn), scheme), x) for attn in ("sdpa", "eager"))
    torch.testing.assert_close(sdpa, eager, atol=1e-5, rtol=1e-4)


def test_bloom_mask_holds_the_bias_once_and_keeps_masked_entries_masked():
    """BLOOM's own alibi argument becomes zeros; the mask its attention adds holds the scheme's bias
    where it attended and the dtype's minimum wherever it was masked (left padding, the future)."""
    model = hp.patch(zoo.build("bloom"), "t5")
    seen: dict[str, torch.Tensor] = {}
    stock_masks: list[torch.Tensor] = []
    block = model.base_model.h[0]
    block.register_forward_pre_hook(lambda m, a, k: stock_masks.append(k["attention_mask"]), with_kwargs=True)
    block.self_attention.register_forward_hook(
        lambda m, a, k, out: seen.update(alibi=k["alibi"], mask=k["attention_mask"]), with_kwargs=True)
    x, mask = zoo.inputs(), torch.ones(2, 12, dtype=torch.long)
    mask[0, :4] = 0
    zoo.logits(model, x, attention_mask=mask)
    assert not seen["alibi"].any()
    low = torch.finfo(seen["mask"].dtype).min
    masked = stock_masks[0] == low
    assert (seen["mask"][masked.expand_as(seen["mask"])] == low).all()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    bias = model.base_model.posenc_bias(positions, positions)
    torch.testing.assert_close(seen["mask"][~masked.expand_as(seen["mask"])], bias[~masked.expand_as(bias)])


def test_bloom_per_head_packing_rotates_queries_and_keys_only():
    """query_key_value emits [q_h k_h v_h] per head: the tap's split, read back by BLOOM's own `_reshape`,
    rotates q and k of every head and leaves v alone."""
    attention = zoo.build("bloom").base_model.h[0].self_attention
    hook = RotateOutput(QKTap(("query_key_value",), packed=True, layout="per_head"), attention.head_dim)
    fused = torch.randn(2, 5, 3 * attention.hidden_size)
    angles = torch.rand(2, 5, attention.head_dim // 2)
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1), torch.cat((angles.sin(), angles.sin()), -1)
    hook.rotation = (cos, sin)
    q, k, v = attention._reshape(hook(attention.query_key_value, (), fused))
    q0, k0, v0 = attention._reshape(fused)
    torch.testing.assert_close(q, rotate(q0.transpose(1, 2), cos, sin).transpose(1, 2))
    torch.testing.assert_close(k, rotate(k0.transpose(1, 2), cos, sin).transpose(1, 2))
    assert torch.equal(v, v0)


def test_bloom_honours_explicit_position_ids_its_causal_lm_would_drop():
    """BloomForCausalLM hands position_ids to the loss, never to BloomModel: the patch takes them at the
    top so that absolute codes move with them and RoPE stays relative; unpatch leaves no hook."""
    x, positions = zoo.inputs(batch=1), torch.arange(12)[None]
    model = hp.patch(zoo.build("bloom"), "learned", init="normal")
    plain = zoo.logits(model, x)
    assert torch.equal(zoo.logits(model, x, position_ids=positions), plain)
    assert not torch.allclose(zoo.logits(model, x, position_ids=positions + 5), plain, atol=1e-3)
    hp.patch(model, "rope")
    torch.testing.assert_close(zoo.logits(model, x, position_ids=positions + 5), zoo.logits(model, x),
                               atol=zoo.SHIFTED_ATOL, rtol=zoo.SHIFTED_ATOL)
    hp.unpatch(model)
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_bloom_input_site_takes_its_trained_length_or_an_option():
    """BLOOM's config names no max_position_embeddings: tables default to its trained 2048 positions."""
    model = zoo.build("bloom")
    assert hp.describe(hp.patch(model, "learned")).options["max_positions"] == 2048
    assert hp.describe(hp.patch(model, "learned", max_positions=64)).options["max_positions"] == 64
    hp.unpatch(model)
    assert not hasattr(model.config, "max_position_embeddings")


@pytest.mark.parametrize("model_type,scheme", [("bloom", "t5"), ("bloom", "rope"), ("bloom", "learned"),
                                               ("falcon", "alibi"), ("falcon", "rope")])
def test_left_padded_generate_with_static_cache_equals_dynamic_and_alone(model_type, scheme):
    """BLOOM's generate pads the 2-D mask on the right to the static cache's length: positions are
    counted over this call's columns, not the mask's last ones."""
    model = hp.patch(zoo.build(model_type), scheme)
    model.generation_config.update(pad_token_id=0, eos_token_id=None, do_sample=False, max_new_tokens=6)
    prompt, other = zoo.inputs(1, 5, seed=2), zoo.inputs(1, 8, seed=3)
    batch = torch.cat((torch.cat((torch.zeros(1, 3, dtype=torch.long), prompt), 1), other))
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    dynamic = model.generate(batch, attention_mask=mask)
    assert torch.equal(model.generate(batch, attention_mask=mask, cache_implementation="static"), dynamic)
    assert torch.equal(dynamic[0, 3:], model.generate(prompt, attention_mask=torch.ones_like(prompt))[0])


@pytest.mark.parametrize("model_type,scheme", [("bloom", "t5"), ("bloom", "rope"), ("falcon", "kerple")])
def test_reload_gives_the_same_logits(tmp_path, model_type, scheme):
    model, x = hp.patch(zoo.build(model_type), scheme), zoo.inputs()
    with torch.no_grad():
        for parameter in (p for m in describe_modules(model) for p in m.parameters()):
            parameter.add_(torch.randn_like(parameter))  # weights a reload must carry
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(zoo.logits(hp.from_pretrained(str(tmp_path)).eval(), x), zoo.logits(model, x))


@pytest.mark.parametrize("model_type,scheme", [("bloom", "t5"), ("bloom", "rope"), ("stablelm", "alibi")])
def test_gradient_checkpointing_recomputes_attention_with_its_private_kwargs(model_type, scheme):
    """Checkpointing recomputes a block's forward in backward without its hooks: the kwargs carried
    (BLOOM) or relayed (StableLM) to the attention module stay there, so the same bias or rotation
    applies: same loss, same gradients."""
    results = []
    for checkpointing in (False, True):
        model = hp.patch(zoo.build(model_type), scheme).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        x = zoo.inputs()
        loss = model(x, labels=x).loss
        loss.backward()
        results.append([loss.detach(), *(p.grad for p in model.parameters() if p.grad is not None)])
    torch.testing.assert_close(results[0], results[1])


def test_attention_site_schemes_are_refused_by_name_where_attention_is_the_models_own():
    """Self-Extend and xPos compute the logits themselves, which needs ALL_ATTENTION_FUNCTIONS: BLOOM's attention is
    its own; Falcon's is up to transformers 5.24 and goes through the interface from 5.25 on, where both take."""
    for model in (zoo.build("bloom"), falcon(True)):
        interface = source_has(type(model.base_model.h[0].self_attention), ("ALL_ATTENTION_FUNCTIONS",))
        for scheme in ("xpos", "self_extend"):
            if interface:
                x = zoo.inputs(length=10)
                stock = zoo.logits(model, x)
                hp.patch(model, scheme)
                assert not torch.allclose(zoo.logits(model, x), stock, atol=1e-3)
                torch.testing.assert_close(cached_logits(model, x, 6), zoo.logits(model, x), atol=1e-4, rtol=1e-4)
                hp.unpatch(model)
                continue
            assert "does not call attention through" in hp.catalog.why_not(model, scheme)
            with pytest.raises(hp.PosEncError, match="cannot take scheme"):
                hp.patch(model, scheme)
            assert hp.describe(model) is None
