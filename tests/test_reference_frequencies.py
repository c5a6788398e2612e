"""The schemes of issue 30 against references written here from their papers' formulas (the architectures'
reference forwards come from test_reference.py): p-RoPE, HoPE, FoPE, PoPE and CoPE."""

from __future__ import annotations

import math

import pytest
import torch

import hf_posenc as hp
from conftest import TINY_CONFIGS, tiny_model
from test_reference import ARCHS, HEAD_DIM, POS, REFERENCES, THETA, ids_for_reference, inv_freq, rotate_complex

ARCH_NAMES = sorted(TINY_CONFIGS)


def patched_output(model: torch.nn.Module, scheme: str, **options) -> torch.Tensor:
    with torch.no_grad():
        return hp.patch(model, scheme, **options)(ids_for_reference()).last_hidden_state


def reference_output(arch: str, model: torch.nn.Module, **kwargs) -> torch.Tensor:
    """The architecture's reference forward on the model's weights, its own positions taken away."""
    reference, _ = REFERENCES[arch]
    with torch.no_grad():
        hp.patch(model, "nope")
        return reference(model, ids_for_reference(), **kwargs)


# ---- p-RoPE (Barbero et al. 2025) and HoPE (Chen et al. 2025): RoPE on some of its own frequencies ----

@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("arch", ARCHS)
def test_p_rope_rotates_the_highest_fraction_p_of_ropes_frequencies(arch, p):
    """Pairs i < floor(p d/2) rotate at theta^(-2i/d), RoPE's own frequencies; the rest not at all."""
    kept = inv_freq(HEAD_DIM)[: int(p * HEAD_DIM // 2)]
    model = tiny_model(arch, head="base")
    expected = reference_output(arch, model, qk=lambda x, role: rotate_complex(x, POS, kept))
    torch.testing.assert_close(patched_output(model, "p_rope", p=p, theta=THETA), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_p_rope_at_one_is_rope_and_at_zero_is_nope_bit_for_bit(arch):
    """The same (cos, sin) reach the same rotation code: p = 1 hands RoPE's, p = 0 cos = 1 and sin = 0,
    which rotate x to x1 * 1 - x2 * 0 = x1 exactly (NoPE models do not rotate at all)."""
    x = ids_for_reference()
    model = tiny_model(arch)
    with torch.no_grad():
        rope, nope = hp.patch(model, "rope")(x).logits, hp.patch(model, "nope")(x).logits
        one, zero = hp.patch(model, "p_rope", p=1.0)(x).logits, hp.patch(model, "p_rope", p=0.0)(x).logits
    assert torch.equal(one, rope) and torch.equal(zero, nope)
    assert not torch.allclose(rope, nope, atol=1e-3)


@pytest.mark.parametrize("trained", [16, 64, 700])
@pytest.mark.parametrize("arch", ARCHS)
def test_hope_keeps_the_frequencies_that_complete_a_period_within_the_training_length(arch, trained):
    """Chen et al. 2025: components whose period 2 pi / theta_i exceeds the training length L become
    position-independent; the others rotate as in RoPE."""
    freqs = inv_freq(HEAD_DIM)
    kept = freqs[: int((2 * math.pi / freqs <= trained).sum())]
    assert 0 < len(kept) < len(freqs)
    model = tiny_model(arch, head="base")
    expected = reference_output(arch, model, qk=lambda x, role: rotate_complex(x, POS, kept))
    got = patched_output(model, "hope", original_max_position_embeddings=trained, theta=THETA)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_hope_defaults_to_the_models_own_trained_length():
    model = hp.patch(tiny_model("llama"), "hope")
    assert hp.describe(model).options["original_max_position_embeddings"] == model.config.max_position_embeddings


# ---- FoPE (Hua et al. 2025): each pair a Fourier series of RoPE's frequencies, under-trained ones zeroed ----

def fourier_rotate(x: torch.Tensor, cos_coef: torch.Tensor, sin_coef: torch.Tensor, trained: int) -> torch.Tensor:
    """Pair m of x (B, H, L, D) as a complex number times cos'_m(n) + i sin'_m(n), where
    cos'_m(n) = sum_j C_mj cos(w_j n), sin'_m(n) = sum_j S_mj sin(w_j n) and w_j = 0 if 2 pi / w_j > L."""
    half = x.shape[-1] // 2
    w = [0.0 if 2 * math.pi / f > trained else f for f in inv_freq(2 * half).tolist()]
    out = torch.empty(x.shape, dtype=torch.float64)
    for n in range(x.shape[2]):
        for m in range(half):
            c = sum(float(cos_coef[m, j]) * math.cos(w[j] * n) for j in range(half))
            s = sum(float(sin_coef[m, j]) * math.sin(w[j] * n) for j in range(half))
            a, b = x[:, :, n, m].double(), x[:, :, n, m + half].double()
            out[:, :, n, m], out[:, :, n, m + half] = a * c - b * s, b * c + a * s
    return out.float()


@pytest.mark.parametrize("arch", ARCHS)
def test_fope_rotates_by_fourier_series_of_the_trained_frequencies(arch):
    trained = 64
    model = tiny_model(arch, head="base")
    hp.patch(model, "fope", sigma=0.4, theta=THETA, original_max_position_embeddings=trained)
    (series,) = hp.patching.describe_modules(model)
    cos_coef, sin_coef = series.cos_coef.detach().clone(), series.sin_coef.detach().clone()
    assert torch.equal(cos_coef.diagonal(), torch.ones(HEAD_DIM // 2)) and cos_coef.std() > 0.1
    with torch.no_grad():
        got = model(ids_for_reference()).last_hidden_state
    expected = reference_output(arch, model, qk=lambda x, role: fourier_rotate(x, cos_coef, sin_coef, trained))
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_fope_without_off_diagonal_terms_is_hope(arch):
    x = ids_for_reference()
    model = tiny_model(arch)
    with torch.no_grad():
        hope = hp.patch(model, "hope")(x).logits
        assert torch.equal(hp.patch(model, "fope", sigma=0.0)(x).logits, hope)


# ---- PoPE (Gopalakrishnan et al. 2025): magnitudes from content, phases from positions ----

@pytest.mark.parametrize("arch", ARCHS)
def test_pope_logits_are_the_polar_sum_over_components(arch):
    """a(t, s) = sum_c softplus(q_c) softplus(k_c) cos((t - s) theta_c + delta_c), theta_c = theta^(-c/d),
    pair by pair and component by component."""
    model = tiny_model(arch, head="base")
    hp.patch(model, "pope", theta=THETA)
    (polar,) = hp.patching.describe_modules(model)
    with torch.no_grad():
        polar.phase.normal_(generator=torch.Generator().manual_seed(3))
        got = model(ids_for_reference()).last_hidden_state
    delta = polar.phase.detach().double().clone()  # (H, d)
    theta = [THETA ** (-c / HEAD_DIM) for c in range(HEAD_DIM)]

    def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        mq, mk = torch.nn.functional.softplus(q.double()), torch.nn.functional.softplus(k.double())
        out = torch.empty(*q.shape[:2], q.shape[2], k.shape[2], dtype=torch.float64)
        for t in range(q.shape[2]):
            for s in range(k.shape[2]):
                phase = torch.tensor([(t - s) * theta[c] for c in range(HEAD_DIM)], dtype=torch.float64)
                out[:, :, t, s] = (mq[:, :, t] * mk[:, :, s] * torch.cos(phase + delta)).sum(-1)
        return out.float()

    expected = reference_output(arch, model, logits=logits)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


# ---- CoPE (Golovneva et al. 2024): positions counted by gates over the keys ----

@pytest.mark.parametrize("npos_max", [64, 3])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_cope_logits_add_interpolated_embeddings_of_counted_positions(arch, npos_max):
    """p_ij = sum_{t=j}^{i} sigmoid(q_i . k_t / sqrt(d)), clamped to npos_max - 1; the logit is
    q_i . (k_j + e[p_ij]) with e interpolated linearly between integer positions (npos_max 3: clamped)."""
    model = tiny_model(arch, head="base")
    hp.patch(model, "cope", init_std=0.5, npos_max=npos_max)
    (cope,) = hp.patching.describe_modules(model)
    e = cope.embeddings.detach().double().clone()
    with torch.no_grad():
        got = model(ids_for_reference()).last_hidden_state

    def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q, k = q.double(), k.double()
        out = torch.zeros(*q.shape[:2], q.shape[2], k.shape[2], dtype=torch.float64)
        for b in range(q.shape[0]):
            for h in range(q.shape[1]):
                for i in range(q.shape[2]):
                    for j in range(i + 1):
                        p = sum(torch.sigmoid(q[b, h, i] @ k[b, h, t] / math.sqrt(HEAD_DIM)) for t in range(j, i + 1))
                        p = min(float(p), npos_max - 1)
                        low, high = math.floor(p), math.ceil(p)
                        embedding = (p - low) * e[high] + (1 - p + low) * e[low]
                        out[b, h, i, j] = q[b, h, i] @ (k[b, h, j] + embedding)
        return out.float()

    expected = reference_output(arch, model, logits=logits)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_cope_refuses_a_bidirectional_model_by_name():
    with pytest.raises(hp.PosEncError, match="'cope' needs a causal model"):
        hp.patch(tiny_model("bert"), "cope")
