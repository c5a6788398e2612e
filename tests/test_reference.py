"""Patched models against independent reference forwards written here from the papers' formulas.

The references re-implement GPT-2, BERT and Llama blocks from their weights, and the positional
schemes from their definitions (RoPE as complex multiplication, Su et al. 2021 eq. 12; sinusoids,
Vaswani et al. 2017 sec. 3.5; ALiBi slopes, Press et al. 2022 sec. 3; position interpolation,
Chen et al. 2023 eq. 3; NTK-aware base, Peng et al. 2023 eq. 16; YaRN, Peng et al. 2023 sec. 3.2-3.4).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import hf_posenc as hp
from conftest import TINY, tiny_model

L = 20  # sequence length used throughout
THETA = 10_000.0


# ---- the schemes, from their papers -------------------------------------------------------

def sinusoid(n: int, d: int) -> torch.Tensor:
    pe = torch.zeros(n, d)
    for pos in range(n):
        for i in range(0, d, 2):
            pe[pos, i] = math.sin(pos / THETA ** (i / d))
            pe[pos, i + 1] = math.cos(pos / THETA ** (i / d))
    return pe


def inv_freq(rot_dim: int, theta: float = THETA) -> torch.Tensor:
    return torch.tensor([theta ** (-2 * j / rot_dim) for j in range(rot_dim // 2)], dtype=torch.float64)


def yarn_inv_freq(rot_dim: int, factor: float, original: int, beta_fast=32.0, beta_slow=1.0) -> torch.Tensor:
    """NTK-by-parts: dimension j is interpolated by `factor` when its wavelength is long compared with
    the trained length, kept when short, and ramped linearly in between (dims from eq. 17-18)."""
    def correction_dim(rotations: float) -> float:
        return rot_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(THETA))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rot_dim - 1)
    base = inv_freq(rot_dim)
    out = torch.empty_like(base)
    for j in range(rot_dim // 2):
        ramp = min(max((j - low) / max(high - low, 1e-3), 0.0), 1.0)  # 0 = keep, 1 = interpolate
        out[j] = base[j] / factor * ramp + base[j] * (1 - ramp)
    return out


def rotate_complex(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x (B, H, L, D): pairs (j, j + D/2) as complex numbers times exp(i * p * freq_j) for the first
    len(freqs) pairs; the remaining pairs do not rotate (partial RoPE)."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    angles = torch.zeros(len(positions), half, dtype=torch.float64)
    angles[:, : len(freqs)] = positions.double()[:, None] * freqs[None]
    z = z * torch.polar(torch.full_like(angles, scale), angles)
    return torch.cat((z.real, z.imag), dim=-1).to(x.dtype)


def alibi_bias(heads: int, causal: bool) -> torch.Tensor:
    slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])  # power-of-two head count
    i = torch.arange(L)
    distance = (i[:, None] - i[None, :]).abs().float()
    return -slopes[:, None, None] * distance


# ---- the architectures, from their weights --------------------------------------------------

def attend(q, k, v, bias=None, causal=True, logits=None):
    scores = (logits(q, k) if logits is not None else q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if causal:
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def heads(x, n):
    return x.unflatten(-1, (n, -1)).transpose(1, 2)


def merge(x):
    return x.transpose(1, 2).flatten(-2)


def gpt2_reference(model, ids, add=None, qk=None, bias=None, tokens=lambda x: x, logits=None):
    t, n = model.base_model, TINY["heads"]
    x = tokens(t.wte(ids)) + (add if add is not None else 0)
    for block in t.h:
        h = F.layer_norm(x, (x.shape[-1],), block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
        q, k, v = (h @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(x.shape[-1], dim=-1)
        q, k, v = heads(q, n), heads(k, n), heads(v, n)
        if qk is not None:
            q, k = qk(q, "q"), qk(k, "k")
        x = x + merge(attend(q, k, v, bias, logits=logits)) @ block.attn.c_proj.weight + block.attn.c_proj.bias
        h = F.layer_norm(x, (x.shape[-1],), block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
        h = F.gelu(h @ block.mlp.c_fc.weight + block.mlp.c_fc.bias, approximate="tanh")
        x = x + h @ block.mlp.c_proj.weight + block.mlp.c_proj.bias
    return F.layer_norm(x, (x.shape[-1],), t.ln_f.weight, t.ln_f.bias, t.ln_f.eps)


def bert_reference(model, ids, add=None, qk=None, bias=None, tokens=lambda x: x, logits=None):
    model = model.base_model
    e, n = model.embeddings, TINY["heads"]
    x = tokens(e.word_embeddings(ids)) + tokens(e.token_type_embeddings(torch.zeros_like(ids)))
    x = x + (add if add is not None else 0)
    x = e.LayerNorm(x)
    for layer in model.encoder.layer:
        a = layer.attention
        q, k, v = (heads(lin(x), n) for lin in (a.self.query, a.self.key, a.self.value))
        if qk is not None:
            q, k = qk(q, "q"), qk(k, "k")
        x = a.output.LayerNorm(x + a.output.dense(merge(attend(q, k, v, bias, causal=False, logits=logits))))
        h = F.gelu(layer.intermediate.dense(x))
        x = layer.output.LayerNorm(x + layer.output.dense(h))
    return x


def llama_reference(model, ids, add=None, qk=None, bias=None, tokens=lambda x: x, logits=None):
    m, n, kv = model.base_model, TINY["heads"], 2
    x = tokens(m.embed_tokens(ids)) + (add if add is not None else 0)
    for layer in m.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = heads(a.q_proj(h), n), heads(a.k_proj(h), kv), heads(a.v_proj(h), kv)
        if qk is not None:
            q, k = qk(q, "q"), qk(k, "k")
        k, v = k.repeat_interleave(n // kv, 1), v.repeat_interleave(n // kv, 1)
        x = x + a.o_proj(merge(attend(q, k, v, bias, logits=logits)))
        h = layer.post_attention_layernorm(x)
        x = x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
    return m.norm(x)


# ---- the cells ----------------------------------------------------------------------------

HEAD_DIM = TINY["hidden"] // TINY["heads"]
POS = torch.arange(L)
ORIG = TINY["positions"]

# label -> (scheme, options, reference kwargs factory)
CASES = {
    "nope": ("nope", {}, lambda causal: {}),
    "sinusoidal": ("sinusoidal", {"scale": 1.0}, lambda causal: {"add": sinusoid(L, TINY["hidden"])}),
    "rope": ("rope", {"theta": THETA}, lambda causal: {"qk": lambda x, role: rotate_complex(x, POS, inv_freq(HEAD_DIM))}),
    "rope-partial": ("rope", {"theta": THETA, "partial": 0.5},
                     lambda causal: {"qk": lambda x, role: rotate_complex(x, POS, inv_freq(HEAD_DIM // 2))}),
    "linear": ("linear", {"factor": 4.0, "theta": THETA},
               lambda causal: {"qk": lambda x, role: rotate_complex(x, POS / 4.0, inv_freq(HEAD_DIM))}),
    "ntk": ("ntk", {"factor": 4.0, "theta": THETA},
            lambda causal: {"qk": lambda x, role: rotate_complex(x, POS, inv_freq(HEAD_DIM, THETA * 4.0 ** (HEAD_DIM / (HEAD_DIM - 2))))}),
    "yarn": ("yarn", {"factor": 4.0, "theta": THETA},
             lambda causal: {"qk": lambda x, role: rotate_complex(x, POS, yarn_inv_freq(HEAD_DIM, 4.0, ORIG), 0.1 * math.log(4.0) + 1)}),
    "alibi": ("alibi", {}, lambda causal: {"bias": alibi_bias(TINY["heads"], causal)}),
}
REFERENCES = {"gpt2": (gpt2_reference, True), "bert": (bert_reference, False), "llama": (llama_reference, True)}
ARCHS = sorted(REFERENCES)


@pytest.mark.parametrize("label", sorted(CASES))
@pytest.mark.parametrize("arch", ARCHS)
def test_patched_model_equals_reference(arch, label):
    scheme, options, reference_kwargs = CASES[label]
    model = tiny_model(arch, head="base")
    ids = torch.randint(3, TINY["vocab"], (2, L), generator=torch.Generator().manual_seed(0))
    reference, causal = REFERENCES[arch]
    expected = reference(model, ids, **reference_kwargs(causal))
    hp.patch(model, scheme, **options)
    with torch.no_grad():
        got = model(ids).last_hidden_state
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_learned_copy_is_the_stock_model_and_interpolate_resamples(arch):
    model = tiny_model(arch, head="base")
    ids = torch.randint(3, TINY["vocab"], (2, L), generator=torch.Generator().manual_seed(0))
    table = (model.wpe if arch == "gpt2" else model.embeddings.position_embeddings).weight.detach().clone()
    reference = REFERENCES[arch][0]
    stock = reference(model, ids, add=table[:L])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).last_hidden_state, stock, atol=2e-5, rtol=1e-4)
        hp.patch(model, "learned", init="copy")
        torch.testing.assert_close(model(ids).last_hidden_state, stock, atol=2e-5, rtol=1e-4)
        # interpolate to twice the length: row 2p is old row p (Chen et al. 2023, for learned tables)
        hp.patch(model, "learned", init="interpolate", max_positions=2 * ORIG - 1)
        new = hp.patching.describe_modules(model)[0].weight
        torch.testing.assert_close(new[0::2], table, atol=1e-6, rtol=0)
        assert model.config.max_position_embeddings == 2 * ORIG - 1


def test_alibi_slopes_for_any_head_count():
    from hf_posenc.schemes.alibi import alibi_slopes

    assert alibi_slopes(8).tolist() == [2 ** -(h + 1) for h in range(8)]  # Press et al.: 1/2, 1/4, ..., 1/256
    # 12 heads: the 8-head sequence, then every other slope of the 16-head sequence
    sixteen = [2 ** (-0.5 * (h + 1)) for h in range(16)]
    assert alibi_slopes(12).tolist() == pytest.approx([2 ** -(h + 1) for h in range(8)] + sixteen[0::2][:4])


def test_yarn_factor_one_is_the_original_model():
    model = tiny_model("llama")
    ids = torch.randint(3, TINY["vocab"], (1, L))
    expected = model(ids).logits
    hp.patch(model, "yarn", factor=1.0)
    torch.testing.assert_close(model(ids).logits, expected, atol=1e-6, rtol=0)


def test_rope_is_relative_shift_invariant():
    """Su et al. 2021: q_m . k_n depends on m - n only, so shifting every position changes nothing."""
    model = hp.patch(tiny_model("gpt2"), "rope")
    ids = torch.randint(3, TINY["vocab"], (1, L))
    a = model(ids, position_ids=torch.arange(L)[None]).logits
    b = model(ids, position_ids=torch.arange(L)[None] + 17).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# ---- learned relative biases, concatenation, xPos: the formulas, with the patch's own parameters ----

def ids_for_reference():
    return torch.randint(3, TINY["vocab"], (2, L), generator=torch.Generator().manual_seed(0))


def t5_bucket_reference(distance: int, causal: bool, num_buckets: int = 32, max_distance: int = 128) -> int:
    """Raffel et al. 2020: exact buckets for small distances, logarithmic ones up to max_distance."""
    offset = 0
    if not causal:
        num_buckets //= 2
        if distance < 0:
            offset = num_buckets
        distance = abs(distance)
    else:
        distance = max(distance, 0)
    exact = num_buckets // 2
    if distance < exact:
        return offset + distance
    bucket = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return offset + min(bucket, num_buckets - 1)


def bias_reference(label: str, module: torch.nn.Module, causal: bool) -> torch.Tensor:
    i = torch.arange(L)
    d = (i[:, None] - i[None, :]).double()
    if label == "t5":
        table = module.relative_attention_bias.weight.double()
        buckets = torch.tensor([[t5_bucket_reference(int(x), causal) for x in row] for row in d])
        return table[buckets].permute(2, 0, 1)
    if label == "kerple":  # -r1 log(1 + r2 |i - j|)
        r1, r2 = module.log_r1.double().exp(), module.log_r2.double().exp()
        return -r1[:, None, None] * torch.log(1 + r2[:, None, None] * d.abs())
    if label == "fire":  # f(psi(|i - j|) / psi(max(L, i + 1))), psi(x) = log(cx + 1)
        c, threshold = module.log_c.double().exp(), module.log_threshold.double().exp()
        psi = lambda x: torch.log(c * x + 1)  # noqa: E731
        x = psi(d.abs()) / psi(torch.maximum(i.double() + 1, threshold))[:, None]
        w1, b1, w2, b2 = (p.double() for p in (module.mlp[0].weight, module.mlp[0].bias, module.mlp[2].weight, module.mlp[2].bias))
        return (torch.relu(x[..., None] @ w1.T + b1) @ w2.T + b2).permute(2, 0, 1)
    if label == "untied":  # TUPE: (p_i U^Q)(p_j U^K)^T / sqrt(2 d_h), per head
        p = module.positions.double()[:L]
        q = (p @ module.query.double()).unflatten(-1, (TINY["heads"], -1)).transpose(0, 1)
        k = (p @ module.key.double()).unflatten(-1, (TINY["heads"], -1)).transpose(0, 1)
        return q @ k.transpose(-1, -2) / math.sqrt(2 * HEAD_DIM)
    raise KeyError(label)


LEARNED_BIASES = {"t5": {"init_std": 0.5}, "kerple": {"r1": 0.7, "r2": 1.3}, "fire": {"init": "random"},
                  "untied": {"init_std": 0.3}}


@pytest.mark.parametrize("label", sorted(LEARNED_BIASES))
@pytest.mark.parametrize("arch", ARCHS)
def test_learned_biases_equal_their_formulas(arch, label):
    model = hp.patch(tiny_model(arch, head="base"), label, **LEARNED_BIASES[label])
    (bias_module,) = hp.patching.describe_modules(model)
    reference, causal = REFERENCES[arch]
    ids = ids_for_reference()
    with torch.no_grad():
        got = model(ids).last_hidden_state
        hp.unpatch(model)
        hp.patch(model, "nope")  # the token path of a biased model carries no positions
        expected = reference(model, ids, bias=bias_reference(label, bias_module, causal).float())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("code", ["sinusoidal", "learned"])
def test_concat_is_projection_plus_code_in_the_complement(arch, code):
    import numpy as np

    d_pos = 16
    model = tiny_model(arch, head="base")
    ids = ids_for_reference()
    emb = model.get_input_embeddings().weight.detach().double().numpy()
    _, singular, vh = np.linalg.svd(emb, full_matrices=False)
    tok = torch.from_numpy(vh[: TINY["hidden"] - d_pos].T)
    pos = torch.from_numpy(vh[TINY["hidden"] - d_pos:].T)
    hp.patch(model, "concat", d_pos=d_pos, code=code)
    (module,) = hp.patching.describe_modules(model)
    # singular vectors are defined up to sign: compare the spans through their projectors
    torch.testing.assert_close(module.position_basis.double() @ module.position_basis.double().T, pos @ pos.T,
                               atol=1e-5, rtol=0)
    pos = module.position_basis.double()
    scale = model.config.posenc["options"]["scale"]
    codes = module.table.detach().double()[:L] if code == "learned" else sinusoid(L, d_pos).double() * scale * 2**0.5
    kept = float((singular[: TINY["hidden"] - d_pos] ** 2).sum() / (singular**2).sum())
    assert model.config.posenc["notes"]["token_energy_kept"] == pytest.approx(kept, abs=1e-5)
    reference, _ = REFERENCES[arch]
    with torch.no_grad():
        got = model(ids).last_hidden_state
        hp.unpatch(model)
        hp.patch(model, "nope")
        expected = reference(model, ids, add=(codes @ pos.T).float(),
                             tokens=lambda x: (x.double() @ tok @ tok.T).float())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    # token and position channels are orthogonal (to fp32 precision of the stored bases)
    assert float((module.token_basis.double().T @ module.position_basis.double()).abs().max()) < 1e-5


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_xpos_equals_rotation_with_centred_decay(arch):
    """Sun et al. 2022, eq. 5-6: q_n scaled by zeta^(n/B), k_m by zeta^(-m/B), zeta_i = (2i/d + 0.4)/1.4,
    with positions counted from the middle of the window, as the paper's reference code (torchscale's
    XPOS: positions -(L // 2) .. L - L // 2 - 1)."""
    base = 8.0
    zeta = torch.tensor([(2 * i / HEAD_DIM + 0.4) / 1.4 for i in range(HEAD_DIM // 2)], dtype=torch.float64)
    centred = POS.double() - L // 2
    scale = zeta[None, :] ** (centred[:, None] / base)  # (L, D/2)
    scale = torch.cat((scale, scale), dim=-1)

    def qk(x, role):
        rotated = rotate_complex(x, POS, inv_freq(HEAD_DIM)).double()
        return (rotated * (scale if role == "q" else 1 / scale)).float()

    model = tiny_model(arch, head="base")
    ids = ids_for_reference()
    reference, _ = REFERENCES[arch]
    with torch.no_grad():
        hp.patch(model, "nope")
        expected = reference(model, ids, qk=qk)
        hp.patch(model, "xpos", theta=THETA, scale_base=base)
        got = model(ids).last_hidden_state
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("scheme,options", [("concat", {"d_pos": 0}), ("untied", {"init_std": 0.0}),
                                            ("t5", {}), ("fire", {})])
def test_degenerate_settings_reduce_to_nope(arch, scheme, options):
    ids = ids_for_reference()
    model = tiny_model(arch, head="base")
    with torch.no_grad():
        nope = hp.patch(model, "nope")(ids).last_hidden_state
        got = hp.patch(model, scheme, **options)(ids).last_hidden_state
    torch.testing.assert_close(got, nope, atol=1e-4, rtol=1e-4)  # concat d_pos=0 projects in fp32


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_self_extend_equals_grouped_attention(arch):
    """Jin et al. 2024, eq. 3-4: relative distance i - j < W uses the true positions; beyond it the query
    sits at floor(i/G) + W - floor(W/G) and the key at floor(j/G)."""
    group, window = 3, 5
    freqs = inv_freq(HEAD_DIM)

    def logits(q, k):
        out = torch.empty(q.shape[0], q.shape[1], L, L, dtype=torch.float64)
        for i in range(L):
            for j in range(L):
                if i - j < window:
                    qi, kj = i, j
                else:
                    qi, kj = i // group + window - window // group, j // group
                qr = rotate_complex(q[:, :, i : i + 1], torch.tensor([qi]), freqs).double()
                kr = rotate_complex(k[:, :, j : j + 1], torch.tensor([kj]), freqs).double()
                out[:, :, i, j] = (qr * kr).sum(-1)[..., 0]
        return out.float()

    model = tiny_model(arch, head="base")
    ids = ids_for_reference()
    reference, _ = REFERENCES[arch]
    with torch.no_grad():
        hp.patch(model, "nope")
        expected = reference(model, ids, logits=logits)
        hp.patch(model, "self_extend", group=group, window=window, theta=THETA)
        got = model(ids).last_hidden_state
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
