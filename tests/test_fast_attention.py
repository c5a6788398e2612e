"""hf_posenc.fast_attention: every backend equals an attention written here from the schemes' own
materialised biases (which test_reference.py checks against the papers' formulas) and a mask built
from explicit slot arithmetic, for every position term, on the invariant matrix of short inputs:
causal, sliding window, left padding, packed documents, grouped KV heads, a cached decode step,
queries that continue a cache, a static cache's empty slots and positions that do not start at 0.

FlexAttention compiles one kernel per (position term, mask kind, padded shape), so every flex case of
one term shares two kernels (prefill shapes and short-query shapes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

from hf_posenc import fast_attention
from hf_posenc.errors import PosEncError
from hf_posenc.fast_attention import MaskSpec, backends, biased_attention, choose_backend
from hf_posenc.fast_attention.masks import Mask, resolve
from hf_posenc.fast_attention.terms import Call
from hf_posenc.schemes.alibi import AlibiBias
from hf_posenc.schemes.fire import FireBias
from hf_posenc.schemes.kerple import KerpleBias
from hf_posenc.schemes.t5 import T5Bias
from hf_posenc.schemes.rotary import Rotary
from hf_posenc.schemes.self_extend import SelfExtendAttention
from hf_posenc.schemes.untied import UntiedBias

B, H, HKV, D, L = 2, 4, 2, 16, 200  # L spans two flex blocks, so block sparsity is exercised
WINDOW = 37


def make_bias(name: str, causal: bool = True) -> torch.nn.Module | None:
    torch.manual_seed(1)
    if name == "none":
        return None
    if name == "alibi":
        return AlibiBias(H, 8.0)
    if name == "t5":
        return T5Bias(H, causal, 32, 128, init_std=1.0)
    if name == "fire":
        return FireBias(H, 8, c=0.1, threshold=64.0, zero_init=False)  # 8 hidden units: a shorter compile
    if name == "kerple":
        return KerpleBias(H, "log", 0.7, 1.3)
    if name == "kerple_power":
        return KerpleBias(H, "power", 0.7, 1.3)
    if name == "untied":
        return UntiedBias(torch.randn(600, 64), H, D, init_std=0.3)
    if name == "self_extend":
        return SelfExtendAttention(Rotary(D, {"rope_type": "default", "rope_theta": 100.0}, 1.0, 1024), group=3, window=WINDOW)
    raise KeyError(name)


TERMS = ["none", "alibi", "t5", "fire", "kerple", "kerple_power", "untied", "self_extend"]
LEARNED = ["t5", "fire", "kerple", "untied"]


@dataclass
class Case:
    """One attention call: q queries at key slots `slots` among k keys, with their positions."""

    q: int
    k: int
    k_pos: torch.Tensor  # (B, k)
    slots: torch.Tensor  # (B, q) key slot of each query row
    spec: MaskSpec

    @property
    def q_pos(self) -> torch.Tensor:
        return self.k_pos.gather(1, self.slots)


def positions(k: int, shift: int = 0) -> torch.Tensor:
    pos = torch.arange(k)[None].repeat(B, 1)
    pos[1] += shift
    return pos


def last_rows(q: int, k: int) -> torch.Tensor:
    return torch.arange(k - q, k)[None].repeat(B, 1)


def make_case(name: str) -> Case:
    if name == "causal":  # row 1's positions start at 7: a relative term must not care
        return Case(L, L, positions(L, shift=7), last_rows(L, L), MaskSpec())
    if name == "window":
        return Case(L, L, positions(L), last_rows(L, L), MaskSpec(sliding_window=WINDOW))
    if name == "left_padding":  # row 1 starts with 30 pad slots; positions counted over the mask
        padding = torch.ones(B, L, dtype=torch.bool)
        padding[1, :30] = False
        k_pos = (padding.long().cumsum(-1) - 1).clamp(min=0)
        return Case(L, L, k_pos, last_rows(L, L), MaskSpec(key_padding=padding))
    if name == "packed":  # row 0 holds three documents, positions restart in each
        docs = torch.zeros(B, L, dtype=torch.long)
        docs[0, 70:150], docs[0, 150:] = 1, 2
        k_pos = torch.cat([torch.arange(n) for n in (70, 80, 50)])[None].repeat(B, 1)
        k_pos[1] = torch.arange(L)
        return Case(L, L, k_pos, last_rows(L, L), MaskSpec(documents=docs))
    if name == "decode":  # one new token against a cache of L - 1
        return Case(1, L, positions(L, shift=3), last_rows(1, L), MaskSpec(sliding_window=WINDOW * 3))
    if name == "continue":  # 50 queries continuing a cache of 150 keys
        return Case(50, L, positions(L), last_rows(50, L), MaskSpec())
    if name == "static_cache":  # keys live in slots 0..150 of a 200-slot cache; the rest are empty
        filled = torch.arange(L)[None].repeat(B, 1) <= 150
        return Case(1, L, torch.arange(L)[None].repeat(B, 1) * filled, torch.full((B, 1), 150),
                    MaskSpec(key_padding=filled, q_offset=150))
    if name == "bidirectional":
        padding = torch.ones(B, L, dtype=torch.bool)
        padding[0, -25:] = False
        return Case(L, L, positions(L), last_rows(L, L), MaskSpec(causal=False, key_padding=padding))
    raise KeyError(name)


CAUSAL_CASES = ["causal", "window", "left_padding", "packed", "decode", "continue", "static_cache"]


def allowed(case: Case) -> torch.Tensor:
    """(B, 1, q, k) from explicit slot arithmetic, independent of the MaskSpec code."""
    spec, kv = case.spec, torch.arange(case.k)
    distance = case.slots[:, :, None] - kv[None, None, :]
    ok = torch.ones_like(distance, dtype=torch.bool)
    if spec.key_padding is not None:
        ok &= spec.key_padding[:, None, :]
    if spec.documents is not None:
        ok &= spec.documents.gather(1, case.slots)[:, :, None] == spec.documents[:, None, :]
    if spec.causal:
        ok &= (distance >= 0) & (distance < (spec.sliding_window or 10**9))
    elif spec.sliding_window is not None:
        ok &= distance.abs() <= spec.sliding_window
    return ok[:, None]


def inputs(case: Case, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, case.q, D, generator=g) * 1.5  # peaky: a wrong term moves the output by O(1)
    key = torch.randn(B, HKV, case.k, D, generator=g) * 1.5
    return query, key, torch.randn(B, HKV, case.k, D, generator=g)


def reference(bias: torch.nn.Module | None, case: Case, query, key, value) -> torch.Tensor:
    """fp64 softmax attention on the scheme's own materialised logits; rows that see nothing are 0."""
    key, value = key.repeat_interleave(H // HKV, 1), value.repeat_interleave(H // HKV, 1)
    if isinstance(bias, SelfExtendAttention):
        logits = bias(query, key, case.q_pos, case.k_pos).double()
    else:
        logits = query.double() @ key.double().transpose(-1, -2)
        if bias is not None:
            logits = logits + bias(case.q_pos, case.k_pos).double() * math.sqrt(D)
    ok = allowed(case)
    weights = (logits / math.sqrt(D)).masked_fill(~ok, float("-inf")).softmax(-1).nan_to_num()
    return (weights @ value.double()).float().transpose(1, 2)


def run(bias, case: Case, backend: str, query=None, key=None, value=None) -> torch.Tensor:
    if query is None:
        query, key, value = inputs(case)
    out, weights = biased_attention(query, key, value, q_pos=case.q_pos, k_pos=case.k_pos, bias=bias,
                                    mask=case.spec, backend=backend)
    assert weights is None and out.shape == (B, case.q, H, D)
    return out


def assert_matches(bias, case: Case, backend: str) -> None:
    query, key, value = inputs(case)
    with torch.no_grad():
        got = run(bias, case, backend, query, key, value)
        expected = reference(bias, case, query, key, value)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("case", CAUSAL_CASES + ["bidirectional"])
@pytest.mark.parametrize("term", TERMS)
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_backends_equal_the_reference(backend, term, case, monkeypatch):
    if term == "self_extend" and case == "bidirectional":
        pytest.skip("Self-Extend is causal only")
    monkeypatch.setattr(backends, "CHUNK_ELEMENTS", 4096)  # many query blocks, each with its own key span
    assert_matches(make_bias(term, causal=case != "bidirectional"), make_case(case), backend)


def test_the_position_term_matters():
    """Guards the tolerance above: each term moves these outputs far more than it allows."""
    case = make_case("causal")
    plain = reference(None, case, *inputs(case))
    for term in TERMS[1:]:
        assert (reference(make_bias(term), case, *inputs(case)) - plain).abs().max() > 0.1, term


@pytest.mark.parametrize("term", [t for t in TERMS if t != "kerple_power"])  # same kernel code as kerple
def test_flex_equals_the_reference(term):
    bias = make_bias(term)
    for case in CAUSAL_CASES:
        assert_matches(bias, make_case(case), "flex")


def test_flex_takes_one_row_batches_and_view_positions():
    """A batch of one and positions as a view (arange()[None]) once broke the CPU flex kernel."""
    query, key, value = (torch.randn(1, H, L, D) * 1.5 for _ in range(3))
    pos = torch.arange(L)[None]
    with torch.no_grad():
        got, _ = biased_attention(query, key, value, q_pos=pos, k_pos=pos, mask=MaskSpec(), backend="flex")
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    torch.testing.assert_close(got, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("term", ["alibi", "t5"])
def test_flex_bidirectional_equals_the_reference(term):
    assert_matches(make_bias(term, causal=False), make_case("bidirectional"), "flex")


@pytest.mark.parametrize("term", LEARNED + ["self_extend"])
def test_chunked_gradients_equal_dense(term, monkeypatch):
    """Training through the chunked path (recomputed per block) gives the reference gradients for
    the scheme's parameters and for q, k, v, to float32 summation noise: 5e-5 of each tensor's largest
    gradient (FIRE's MLP gradients reach ~10, summed over blocks in another order: ~1e-4 apart; a wrong
    gradient is off by its own size). FIRE's output bias adds a constant per head, which softmax
    ignores: its gradient is 0 up to rounding (~2e-4 here), so it gets a wider atol."""
    monkeypatch.setattr(backends, "CHUNK_ELEMENTS", 4096)
    grads = {}
    for backend in ("dense", "chunked"):
        bias, case = make_bias(term), make_case("left_padding")
        tensors = [t.requires_grad_() for t in inputs(case)]
        out = run(bias, case, backend, *tensors)
        (out * torch.linspace(-1, 1, D)).sum().backward()
        params = {name: p.grad for name, p in bias.named_parameters() if p.grad is not None}
        grads[backend] = {**dict(zip("qkv", (t.grad for t in tensors))), **params}
    assert len(grads["dense"]) >= 3 + (term != "self_extend")
    for name, expected in grads["dense"].items():
        atol = 1e-3 if name == "mlp.2.bias" else max(1e-4, 5e-5 * expected.abs().max().item())
        torch.testing.assert_close(grads["chunked"][name], expected, atol=atol, rtol=1e-4,
                                   msg=lambda message, name=name: f"{name}: {message}")


@pytest.mark.parametrize("backend,term", [("chunked", t) for t in TERMS] + [  # flex: one elementwise, one low-rank
    pytest.param("flex", t, marks=pytest.mark.slow) for t in ("alibi", "untied")])
def test_bfloat16_stays_close_to_float32(backend, term):
    bias, case = make_bias(term), make_case("window")
    query, key, value = inputs(case)
    with torch.no_grad():
        got = run(bias, case, backend, query.bfloat16(), key.bfloat16(), value.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), reference(bias, case, query, key, value), atol=6e-2, rtol=0)


def test_auto_picks_chunked_on_cpu():
    case = make_case("causal")
    with torch.no_grad():
        assert choose_backend(Call(*inputs(case), case.q_pos, case.k_pos, AlibiBias(H, 8.0), case.spec, 0.25, 0.0)) == "chunked"


def test_auto_picks_flex_for_long_inference_where_it_runs_and_chunked_otherwise(monkeypatch):
    """On a device where auto takes flex (CUDA; CPU stands in for it here)."""
    monkeypatch.setattr(fast_attention, "FLEX_DEVICES", ("cpu",))
    case = make_case("causal")
    query, key, value = inputs(case)

    def pick(query, bias=AlibiBias(H, 8.0), dropout=0.0, mask=case.spec):
        q_pos = case.q_pos[:, -query.shape[2]:]
        return choose_backend(Call(query, key, value, q_pos, case.k_pos, bias, mask, 0.25, dropout))

    with torch.no_grad():
        assert pick(query) == "flex"
        assert pick(query[:, :, -1:]) == "chunked"  # a decode step is one chunk
        assert pick(query, dropout=0.1) == "chunked"
    assert pick(query, bias=make_bias("t5")) == "chunked"  # learned parameters want gradients: no CPU flex backward
    assert pick(query.requires_grad_()) == "chunked"


def test_auto_falls_back_to_chunked_when_flex_cannot_compile(monkeypatch):
    """A bias flex cannot lower (a reduction inside score_mod) is reported once and run chunked."""

    class Reduced(AlibiBias):
        def __init__(self) -> None:
            super().__init__(H, 8.0)
            self.register_buffer("weights", torch.rand(64, generator=torch.Generator().manual_seed(0)))

        def by_distance(self, head, distance):
            distance = distance.abs().float()[..., None]
            return -(torch.relu(distance * self.weights - 3) * self.slopes[head][..., None]).sum(-1)

    monkeypatch.setattr(fast_attention, "FLEX_DEVICES", ("cpu",))
    case = make_case("causal")
    with torch.no_grad(), pytest.warns(UserWarning, match="FlexAttention failed to compile"):
        got = run(Reduced(), case, "auto")
    torch.testing.assert_close(got, reference(Reduced(), case, *inputs(case)), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", CAUSAL_CASES + ["bidirectional"])
def test_block_classification_is_safe_and_tight(name):
    """Blocks called full are full and blocks called empty are empty (else flex would skip or unmask
    scores); with no padding (also none from flex's padded lengths) or documents, the index-range
    classification is exact."""
    case = make_case(name)
    for padded_to in (None, (256, 256)):
        mask = resolve(case.spec, B, case.q, case.k, torch.device("cpu"), padded_to=padded_to)
        truth = Mask(mask.mask_mod, B, mask.q_len, mask.k_len, mask.device).blocks()
        full, empty = mask.blocks()
        assert not (full & ~truth[0]).any() and not (empty & ~truth[1]).any()
        if padded_to is None and case.spec.key_padding is None and case.spec.documents is None:
            assert torch.equal(full, truth[0]) and torch.equal(empty, truth[1])


def test_two_copy_blocks_are_safe_and_sparse():
    bias, n = make_bias("self_extend"), 1024
    pos = torch.arange(n)[None].repeat(B, 1)
    query, key = torch.randn(B, H, n, D), torch.randn(B, HKV, n, D)
    mask = Call(query, key, key, pos, pos, bias, MaskSpec(), 0.25, 0.0).problem().mask
    truth = Mask(mask.mask_mod, B, mask.q_len, mask.k_len, mask.device).blocks()
    full, empty = mask.blocks()
    assert not (full & ~truth[0]).any() and not (empty & ~truth[1]).any()
    near, far = empty.chunk(2, dim=-1)  # the near copy is a band, the far one a triangle: flex skips the rest
    assert near.float().mean() > 0.7 and far.float().mean() > 0.4


def test_mask_spec_follows_transformers_conventions():
    """Causal + sliding window + left padding over a cache, as transformers' own sdpa mask builds it."""
    padding = torch.ones(B, L, dtype=torch.bool)
    padding[1, :30] = False
    spec = MaskSpec(sliding_window=WINDOW, key_padding=padding)
    ours = spec.resolve(B, 50, L, torch.device("cpu")).dense(0, 50)
    theirs = sdpa_mask(batch_size=B, q_length=50, kv_length=L, q_offset=L - 50, attention_mask=padding,
                       mask_function=sliding_window_causal_mask_function(WINDOW), allow_is_causal_skip=False)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("backend", ["chunked", "flex"])
def test_four_d_masks_equal_the_spec(backend):
    bias, case = make_bias("alibi"), make_case("left_padding")
    query, key, value = inputs(case)
    dense = allowed(case)
    floats = torch.zeros(dense.shape).masked_fill(~dense, torch.finfo(torch.float32).min)
    with torch.no_grad():
        expected = run(bias, case, backend, query, key, value)
        for mask in (dense, floats, lambda b, h, q, kv: dense[b, 0, q, kv]):
            got = biased_attention(query, key, value, q_pos=case.q_pos, k_pos=case.k_pos, bias=bias, mask=mask,
                                   backend=backend)[0]
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_chunked_runs_inside_torch_compile_fullgraph():
    bias, case = make_bias("t5"), make_case("left_padding")
    query, key, value = inputs(case)

    def attend(query, key, value):
        return biased_attention(query, key, value, q_pos=case.q_pos, k_pos=case.k_pos, bias=bias, mask=case.spec,
                                backend="chunked")[0]

    with torch.no_grad():
        torch.testing.assert_close(torch.compile(attend, fullgraph=True)(query, key, value), attend(query, key, value),
                                   atol=1e-5, rtol=1e-5)


def test_bad_calls_raise_clear_errors():
    case = make_case("causal")
    query, key, value = inputs(case)
    kwargs = dict(q_pos=case.q_pos, k_pos=case.k_pos, mask=case.spec)
    with pytest.raises(PosEncError, match="unknown attention backend 'cuda'"):
        biased_attention(query, key, value, backend="cuda", **kwargs)
    with pytest.raises(PosEncError, match="multiple of key heads"):
        biased_attention(query[:, :3], key, value, **kwargs)
    with pytest.raises(PosEncError, match="q_pos must be"):
        biased_attention(query, key, value, q_pos=case.q_pos[:, :5], k_pos=case.k_pos)
    with pytest.raises(PosEncError, match="only 0"):
        biased_attention(query, key, value, q_pos=case.q_pos, k_pos=case.k_pos, mask=torch.ones(1, 1, L, L))
    with pytest.raises(PosEncError, match="no attention dropout"):
        biased_attention(query, key, value, dropout=0.1, backend="flex", **kwargs)
    with pytest.raises(PosEncError, match="no FlexAttention backward on CPU"):
        biased_attention(query.requires_grad_(), key, value, backend="flex", **kwargs)
    with pytest.raises(PosEncError, match="flash_alibi needs CUDA"):
        biased_attention(query, key, value, bias=AlibiBias(H, 8.0), backend="flash_alibi", **kwargs)
    with pytest.raises(PosEncError, match="offers none of score, factors, rotated_pair"):
        biased_attention(query, key, value, bias=torch.nn.Linear(2, 2), **kwargs)
    with pytest.raises(PosEncError, match="key_padding covers 5 key slots"):
        biased_attention(query, key, value, q_pos=case.q_pos, k_pos=case.k_pos,
                         mask=MaskSpec(key_padding=torch.ones(B, 5, dtype=torch.bool)))


# ------------------------------------------------------------------ wired in: patched models, fused vs dense

from transformers import DynamicCache  # noqa: E402

import hf_posenc as hp  # noqa: E402
from hf_posenc import attention  # noqa: E402
from conftest import TINY_CONFIGS  # noqa: E402
from matrix import ATOL, ids, patched  # noqa: E402

FUSED_LABELS = ["alibi", "t5", "fire", "kerple", "untied", "xpos", "self_extend", "pope"]  # every score / attention
# scheme with a fused form (CoPE has none: its counting gates are materialised on every backend)
MODEL_GREEDY = dict(do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0,
                    eos_token_id=None, max_new_tokens=4)


@pytest.fixture
def small_chunks(monkeypatch):
    """Query blocks of 4 rows: short inputs cross several blocks, each with its own key span."""
    monkeypatch.setattr(backends, "CHUNK_ELEMENTS", 64)
    monkeypatch.setattr(backends, "MIN_CHUNK", 4)


def on(backend: str, run):
    with attention.attention_backend(backend):
        return run()


def assert_fused_equals_dense(run, atol: float = ATOL) -> None:
    dense, fused = on("dense", run), on("chunked", run)
    for got, expected in zip(fused if isinstance(fused, tuple) else (fused,),
                             dense if isinstance(dense, tuple) else (dense,), strict=True):
        torch.testing.assert_close(got, expected, atol=atol, rtol=1e-4)


def counted_chunked_calls(monkeypatch) -> list:
    calls, original = [], fast_attention.BACKENDS["chunked"]
    monkeypatch.setitem(fast_attention.BACKENDS, "chunked", lambda call: calls.append(call) or original(call))
    return calls


def left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    batch = ids(batch=2, length=14, seed=3)
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    return batch, mask


@pytest.mark.parametrize("label", FUSED_LABELS)
def test_fused_path_equals_dense_on_a_patched_model(label, small_chunks, monkeypatch):
    """The rows that matter, forced onto the chunked backend, against the materialised reference:
    left padding, packed rows with restarting position_ids, a ready 4-D float mask, cached prefill +
    decode steps, and greedy generate with the dynamic and the static cache on a left-padded batch.
    Logits at padding positions are left out: those rows see no key (fused: zero output, dense: uniform
    weights) and nothing reads them."""
    model = patched("llama", label)
    batch, mask = left_padded()
    packed = torch.cat([torch.arange(n) for n in (5, 4, 6)])[None]
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([5, 4, 6]))
    allowed = (doc[:, None] == doc[None, :]) & torch.ones(15, 15, dtype=torch.bool).tril()
    floats = torch.zeros(1, 1, 15, 15).masked_fill(~allowed, torch.finfo(torch.float32).min)
    tokens = ids(batch=1, length=15, seed=4)

    def cached():
        cache = DynamicCache(config=model.config)
        first = model(batch[:, :10], attention_mask=mask[:, :10], past_key_values=cache).logits
        rest = model(batch[:, 10:], attention_mask=mask, past_key_values=cache).logits
        return first * mask[:, :10, None], rest

    def generate(kind: str):
        def run():
            out = model.generate(batch, attention_mask=mask, cache_implementation=kind, **MODEL_GREEDY)
            return (out.sequences.float(), *out.scores)
        return run

    with torch.no_grad():
        assert_fused_equals_dense(lambda: model(batch, attention_mask=mask).logits * mask[..., None])
        assert_fused_equals_dense(lambda: model(tokens, position_ids=packed, use_cache=False).logits)
        assert_fused_equals_dense(lambda: model(tokens, attention_mask=floats).logits)
        assert_fused_equals_dense(cached)
        assert_fused_equals_dense(generate("dynamic"), atol=1e-4)
        assert_fused_equals_dense(generate("static"), atol=1e-4)
    # The fused run is not the dense one in disguise: the backend really ran.
    calls = counted_chunked_calls(monkeypatch)
    with torch.no_grad(), attention.attention_backend("chunked"):
        model(batch, attention_mask=mask)
    assert len(calls) == model.config.num_hidden_layers


@pytest.mark.parametrize("label", ["t5", "fire", "kerple", "untied"])
def test_fused_gradients_equal_dense(label, small_chunks):
    """Training a learned bias on the fused path gives the reference gradients (left-padded batch)."""
    model = patched("llama", label).train()
    batch, mask = left_padded()
    params = [p for name, p in model.named_parameters() if "posenc" in name]
    assert params

    # No loss on padding, nor on the first real token, which the last padding position predicts.
    after_padding = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=1) == 0
    labels = batch.masked_fill((mask == 0) | after_padding, -100)

    def grads():
        model.zero_grad()
        model(batch, attention_mask=mask, labels=labels).loss.backward()
        return tuple(p.grad.clone() for p in params)

    assert_fused_equals_dense(grads, atol=1e-5)


def test_fused_path_survives_save_and_reload(tmp_path, small_chunks):
    model = patched("llama", "t5")
    batch, mask = left_padded()
    model.save_pretrained(tmp_path)
    loaded = hp.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = on("dense", lambda: model(batch, attention_mask=mask).logits * mask[..., None])
        torch.testing.assert_close(on("chunked", lambda: loaded(batch, attention_mask=mask).logits * mask[..., None]), expected,
                                   atol=ATOL, rtol=1e-4)


def test_auto_uses_dense_below_the_threshold_and_fused_above(monkeypatch):
    model = patched("llama", "alibi")
    calls = counted_chunked_calls(monkeypatch)
    with torch.no_grad(), attention.attention_backend("auto"):
        model(ids(batch=1, length=12))
        assert not calls
        monkeypatch.setattr(attention, "DENSE_SCORES", 12 * 12)
        model(ids(batch=1, length=12))
    assert len(calls) == model.config.num_hidden_layers


def test_an_additive_float_mask_stays_dense_under_auto_and_is_refused_when_forced(monkeypatch):
    model = patched("llama", "alibi")
    additive = torch.zeros(1, 1, 12, 12).masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), -1e9)
    additive[..., 3] = -2.0  # a soft penalty, not a mask: only the materialised sum keeps it
    tokens = ids(batch=1, length=12)
    monkeypatch.setattr(attention, "DENSE_SCORES", 1)
    with torch.no_grad():
        expected = on("dense", lambda: model(tokens, attention_mask=additive).logits)
        torch.testing.assert_close(on("auto", lambda: model(tokens, attention_mask=additive).logits), expected)
        with pytest.raises(PosEncError, match="needs HF_POSENC_ATTENTION=dense or auto"):
            on("chunked", lambda: model(tokens, attention_mask=additive))
    with pytest.raises(PosEncError, match="choose one of auto, dense, chunked"):
        with attention.attention_backend("fast"):
            pass


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "bert"])  # fused QKV, q/k norms, bidirectional
def test_fused_path_equals_dense_on_other_architectures(arch, small_chunks):
    batch, mask = left_padded()
    if arch == "bert":  # encoders pad on the right
        mask = mask.flip(-1)
    labels = [label for label in FUSED_LABELS if hp.supports(TINY_CONFIGS[arch](), label)]
    assert "alibi" in labels and "t5" in labels
    for label in labels:
        model = patched(arch, label)
        with torch.no_grad():
            assert_fused_equals_dense(lambda: model(batch, attention_mask=mask).logits * mask[..., None])
            assert_fused_equals_dense(lambda: model(batch).logits)


@pytest.mark.slow
@pytest.mark.parametrize("label", ["alibi", "untied"])  # one elementwise term, one low-rank (one compile each)
def test_flex_on_a_patched_model_equals_dense(label):
    model = patched("llama", label)
    batch, mask = left_padded()
    with torch.no_grad():
        expected = on("dense", lambda: model(batch, attention_mask=mask).logits * mask[..., None])
        got = on("flex", lambda: model(batch, attention_mask=mask).logits * mask[..., None])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-4)


@pytest.mark.slow
def test_the_invariant_matrix_holds_on_the_chunked_backend():
    """Every fast row of the invariant matrix (cache, left padding, static cache, shift, packing, 4-D masks,
    reload, peft, ...) for every score / attention scheme, with posenc_sdpa forced onto 4-row query blocks."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_invariants.py", "-m", "not slow",
         "-k", " or ".join(FUSED_LABELS), "--attention-backend", "chunked"],
        cwd=root, capture_output=True, text=True, timeout=1800)
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert int(summary.split(" passed")[0].split()[-1]) >= 300 and "failed" not in summary, summary
