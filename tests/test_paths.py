"""Rows of the matrix about the paths people take with a patched model (issue 9): static caches on
left-padded batches, packed rows (forward and a Trainer step), shifted and explicit positions, ready 4-D
masks, beam search, peft `modules_to_save` and merges, deepcopy and torch.save, fp16 at long lengths.
Each compares against a path that must agree (the same prompt alone, the 2-D mask, the uncached run)."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import DynamicCache, StaticCache

import hf_posenc as hp
from conftest import CAUSAL, TINY, tiny_model
from hf_posenc.schemes.rotary import rotate
from matrix import (ABSOLUTE, ATOL, CELLS, ROWS, SCHEMES, focus, ids, keeps_table, patched, position_offset, row,
                    sample, scheme_of, scope, site_of)

GREEDY = dict(do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
DOCS = (5, 4, 6)  # lengths of the documents packed into one row


def documents(seed: int = 10) -> list[torch.Tensor]:
    return [ids(batch=1, length=n, seed=seed + i) for i, n in enumerate(DOCS)]


def as_4d(allowed: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same (B, 1, q, k) mask as transformers' bool form and as an additive float one."""
    return {"bool": allowed, "float": torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)}


def block_diagonal(causal: bool) -> torch.Tensor:
    """(1, 1, L, L) bool mask letting each packed document see only itself (and only its past if causal)."""
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(DOCS)])
    allowed = doc[:, None] == doc[None, :]
    if causal:
        allowed &= torch.ones_like(allowed).tril()
    return allowed[None, None]


def restarting_positions(offset: int) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in DOCS])[None] + offset


def left_padded_generate(model: torch.nn.Module, prompts: list[torch.Tensor], new: int) -> object:
    """Greedy `generate` on the prompts left-padded into one batch, with the dynamic and the static cache
    (which must agree); returns the dynamic run."""
    longest = max(p.shape[1] for p in prompts)
    batch = torch.cat([torch.cat((torch.zeros(1, longest - p.shape[1], dtype=torch.long), p), dim=1) for p in prompts])
    mask = torch.cat([torch.arange(longest)[None] >= longest - p.shape[1] for p in prompts]).long()
    dynamic = model.generate(batch, attention_mask=mask, max_new_tokens=new, **GREEDY)
    static = model.generate(batch, attention_mask=mask, max_new_tokens=new, cache_implementation="static", **GREEDY)
    assert torch.equal(static.sequences, dynamic.sequences)
    for a, b in zip(static.scores, dynamic.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    return dynamic


def assert_documents_alone(model: torch.nn.Module, packed: torch.Tensor, docs: list[torch.Tensor]) -> None:
    start = 0
    for doc in docs:
        alone = model(doc).logits
        torch.testing.assert_close(packed[:, start : start + doc.shape[1]], alone, atol=ATOL, rtol=1e-4)
        start += doc.shape[1]


# ------------------------------------------------------------------ positions: one source of truth


@row(scope(causal=True), per_label=1)
def test_batched_left_padded_generate_static_equals_dynamic_equals_alone(arch, label):
    model = patched(arch, label)
    prompts = [ids(batch=1, length=9, seed=1), ids(batch=1, length=6, seed=2)]
    dynamic = left_padded_generate(model, prompts, new=5)
    for i, prompt in enumerate(prompts):
        alone = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, **GREEDY)
        assert torch.equal(dynamic.sequences[i, -5:], alone.sequences[0, -5:])
        for a, b in zip(dynamic.scores, alone.scores):
            torch.testing.assert_close(a[i], b[0], atol=1e-4, rtol=1e-4)


@row(CELLS, cells=focus(CELLS))
def test_packed_row_equals_each_document_alone(arch, label):
    """Decoders get transformers' own block-diagonal mask from restarting position_ids; encoders (which
    build none) a ready 4-D one."""
    model = patched(arch, label)
    docs = documents()
    positions = restarting_positions(position_offset(model))
    if arch in CAUSAL:
        packed = model(torch.cat(docs, dim=1), position_ids=positions, use_cache=False).logits
    else:
        packed = model(torch.cat(docs, dim=1), position_ids=positions, attention_mask=block_diagonal(False)).logits
    assert_documents_alone(model, packed, docs)


@row(scope(causal=True), per_label=1)
def test_packed_trainer_step_loss_equals_unpacked(arch, label, tmp_path):
    """A Trainer step on transformers' DataCollatorWithFlattening (documents packed into one row with
    restarting position_ids, no mask) has the loss of the same documents padded into a batch."""
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    model = patched(arch, label)
    docs = [doc[0].tolist() for doc in documents(seed=20)]
    longest = max(DOCS)
    with torch.no_grad():
        unpacked = model(
            input_ids=torch.tensor([doc + [0] * (longest - len(doc)) for doc in docs]),
            attention_mask=torch.tensor([[1] * len(doc) + [0] * (longest - len(doc)) for doc in docs]),
            labels=torch.tensor([doc + [-100] * (longest - len(doc)) for doc in docs]), use_cache=False,
        ).loss
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                             per_device_train_batch_size=len(DOCS), learning_rate=0.0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": doc} for doc in docs],
                      data_collator=DataCollatorWithFlattening())
    assert trainer.train().training_loss == pytest.approx(float(unpacked), abs=1e-5)


@row(CELLS)
def test_constant_shift_of_position_ids(arch, label):
    """Relative schemes see differences of positions only (shift 8: Self-Extend's grouping is invariant
    to multiples of its group); absolute ones must move."""
    model = patched(arch, label)
    x = ids(length=12)
    positions = torch.arange(12)[None] + position_offset(model)
    plain = model(x, position_ids=positions).logits
    shifted = model(x, position_ids=positions + 8).logits
    if label in ABSOLUTE or keeps_table(arch, label):
        assert not torch.allclose(shifted, plain, atol=1e-3), "an absolute scheme ignored the shift"
    else:
        torch.testing.assert_close(shifted, plain, atol=1e-4, rtol=1e-4)


@row(scope(causal=True), per_label=1)
def test_beam_search_cached_equals_uncached(arch, label):
    """Beam search reorders the cache batch every step; the positions of cached keys must follow."""
    model = patched(arch, label)
    x = ids(batch=2, length=7, seed=3)
    kw = dict(max_new_tokens=5, num_beams=2, do_sample=False, return_dict_in_generate=True, output_scores=True,
              pad_token_id=0, eos_token_id=None)
    cached = model.generate(x, use_cache=True, **kw)
    uncached = model.generate(x, use_cache=False, **kw)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("label", ["t5", "alibi", "kerple", "self_extend", "xpos"])
@pytest.mark.parametrize("cache_cls", [DynamicCache, StaticCache])
def test_cached_key_positions_follow_a_reordered_batch(label, cache_cls):
    """Rows with different explicit positions (0.. and 12..), the cache batch swapped as beam search
    does: the next token must see its own row's key positions. These relative schemes are invariant to
    the shift (12 is a multiple of Self-Extend's group), so the reference is the swapped rows from 0."""
    model = patched("llama", label)
    x = ids(batch=2, length=7, seed=4)
    positions = torch.stack((torch.arange(7), torch.arange(7) + 12))
    kw = {"max_cache_len": 16} if cache_cls is StaticCache else {}
    cache = cache_cls(config=model.config, **kw)
    model(x[:, :6], position_ids=positions[:, :6], past_key_values=cache, use_cache=True)
    cache.reorder_cache(torch.tensor([1, 0]))
    step = model(x.flip(0)[:, 6:], position_ids=positions.flip(0)[:, 6:], past_key_values=cache, use_cache=True).logits
    reference = model(x.flip(0), position_ids=torch.arange(7)[None], use_cache=False).logits
    torch.testing.assert_close(step[:, -1], reference[:, -1], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("label", ["alibi", "t5", "self_extend", "xpos", "rope"])
def test_sliding_window_caches_keep_key_positions(label):
    """Mistral with a 5-token window: sliding caches hold the newest keys only (dynamic: the last
    window - 1 plus the new ones; static: a rolling buffer), their positions must be those keys'."""
    model = patched("mistral", label)
    model.config.sliding_window = 5
    x = ids(batch=1, length=12, seed=5)
    full = model(x, use_cache=False).logits
    cache = DynamicCache(config=model.config)
    steps = [model(x[:, :7], past_key_values=cache, use_cache=True).logits]
    steps += [model(x[:, t : t + 1], past_key_values=cache, use_cache=True).logits for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=1e-4)
    left_padded_generate(model, [x[:, :9], x[:, 3:10]], new=6)


# ------------------------------------------------------------------ masks keep their bias


def check_4d_masks(model: torch.nn.Module, causal: bool) -> None:
    x = ids(length=10)
    mask = torch.ones_like(x)
    if causal:
        mask[0, :3] = 0  # left padding
    else:
        mask[0, -3:] = 0  # right padding
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + position_offset(model)
    reference = model(x, attention_mask=mask, position_ids=positions).logits
    allowed = mask.bool()[:, None, None, :].expand(-1, 1, x.shape[1], -1)
    if causal:
        allowed = allowed & torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    valid = mask.bool()
    later = x.clone()
    later[:, -1] = (later[:, -1] + 1) % TINY["vocab"]
    for kind, ready in as_4d(allowed).items():
        out = model(x, attention_mask=ready, position_ids=positions).logits
        torch.testing.assert_close(out[valid], reference[valid], atol=ATOL, rtol=1e-4, msg=f"{kind} 4-D mask")
        if causal:  # no future token changes an earlier logit
            moved = model(later, attention_mask=ready, position_ids=positions).logits
            earlier = valid.clone()
            earlier[:, -1] = False
            torch.testing.assert_close(moved[earlier], out[earlier], atol=ATOL, rtol=1e-4, msg=f"{kind} 4-D mask leaks")
    docs = documents(seed=30)
    for kind, ready in as_4d(block_diagonal(causal)).items():
        packed = model(torch.cat(docs, dim=1), attention_mask=ready,
                       position_ids=restarting_positions(position_offset(model))).logits
        assert_documents_alone(model, packed, docs)


@row(CELLS, cells=focus(CELLS))
def test_4d_masks_equal_the_2d_path(arch, label):
    """A ready bool or float 4-D mask (causal or bidirectional with padding, and block-diagonal packed
    documents) gives the 2-D path's logits; under posenc_eager too for schemes that bias attention."""
    attns = ("sdpa", "eager") if site_of(label) in ("score", "attention") else ("sdpa",)
    for attn in attns:
        check_4d_masks(patched(arch, label, attn=attn), arch in CAUSAL)


# ------------------------------------------------------------------ a patch is plain data


@row(CELLS, cells=focus(CELLS, sites=("score",)))
def test_deepcopy_is_independent_and_torch_save_round_trips(arch, label):
    model = patched(arch, label)
    stock = tiny_model(arch)
    x = ids()
    expected = model(x).logits
    twin = copy.deepcopy(model)
    torch.testing.assert_close(twin(x).logits, expected, atol=0, rtol=0)
    own = [p for module in hp.patching.describe_modules(twin) for p in module.parameters()]
    with torch.no_grad():
        for p in own:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    if own:
        assert not torch.allclose(twin(x).logits, expected, atol=1e-3), "the copy runs the original's weights"
    hp.unpatch(twin)
    assert hp.describe(model) == hp.describe(patched(arch, label))
    torch.testing.assert_close(model(x).logits, expected, atol=0, rtol=0)
    torch.testing.assert_close(twin(x).logits, stock(x).logits, atol=0, rtol=0)
    other = copy.deepcopy(model)
    hp.unpatch(model)
    torch.testing.assert_close(other(x).logits, expected, atol=0, rtol=0)
    buffer = io.BytesIO()
    torch.save(other, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert hp.describe(loaded) == hp.describe(other)
    torch.testing.assert_close(loaded(x).logits, expected, atol=0, rtol=0)
    torch.testing.assert_close(hp.unpatch(loaded)(x).logits, stock(x).logits, atol=0, rtol=0)


LORA_TARGETS = {"gpt2": ["c_attn"], "bert": ["query", "key", "value"], "roberta": ["query", "key", "value"],
                "distilbert": ["q_lin", "k_lin", "v_lin"]}
PEFT_CELLS = sample(CELLS, per_label=1)
ROWS["test_peft_lora_modules_to_save_then_merge_save_reload_in_a_new_process"] = (CELLS, PEFT_CELLS)

RELOAD = textwrap.dedent("""
    import json, sys, torch, transformers, hf_posenc as hp
    cells = json.loads(sys.argv[1])
    out = {}
    for name, (folder, head, x) in cells.items():
        cls = transformers.AutoModelForCausalLM if head == "causal" else transformers.AutoModelForMaskedLM
        model = hp.from_pretrained(folder, model_cls=cls).eval()
        with torch.no_grad():
            out[name] = model(torch.tensor(x)).logits.tolist()
    torch.save(out, sys.argv[2])
""")


def test_peft_lora_modules_to_save_then_merge_save_reload_in_a_new_process(tmp_path):
    """LoRA on the attention projections (the q/k ones included, where rotations are tapped) with the
    scheme's own modules in `modules_to_save`: those get gradients and change; `merge_and_unload` keeps
    the peft model's logits; saved and loaded with `hp.from_pretrained` in a fresh process, they stay."""
    import peft

    expected, cells = {}, {}
    x = ids()
    for arch, label in PEFT_CELLS:
        name = f"{arch}-{label}"
        model = patched(arch, label)
        state = model._posenc_state
        saved = [path.rsplit(".", 1)[-1] for path in state.new_modules
                 if any(True for _ in model.base_model.get_submodule(path).parameters())]
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS.get(arch, ["q_proj", "k_proj", "v_proj"]),
                                 modules_to_save=saved or None, init_lora_weights=False)
        wrapped = peft.get_peft_model(model, config)
        trained = [m for m in hp.patching.describe_modules(wrapped) if any(True for _ in m.parameters())]
        assert len(trained) == len(saved), name
        start = [p.detach().clone() for m in trained for p in m.parameters()]
        optimizer = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=0.05)
        wrapped.train()
        for _ in range(3):
            optimizer.zero_grad()
            wrapped(input_ids=x, labels=x).loss.backward()
            for m in trained:
                assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters()), f"{name}: no gradient"
            optimizer.step()
        after = [p.detach() for m in trained for p in m.parameters()]
        # every parameter with a real gradient moves; a per-head constant added to every score of a row (FIRE's
        # output bias) cancels in the softmax, its gradient is rounding noise (~1e-8) and may not move it at lr 0.05
        noise = [p.grad.abs().max() < 1e-6 for m in trained for p in m.parameters()]
        assert not noise or not all(noise), f"{name}: no parameter of the posenc module has a gradient beyond rounding"
        assert all(quiet or not torch.equal(a, b) for a, b, quiet in zip(start, after, noise)), (
            f"{name}: the posenc module did not change")
        wrapped.eval()
        with torch.no_grad():
            tuned = wrapped(input_ids=x).logits
            merged = wrapped.merge_and_unload()
            torch.testing.assert_close(merged(x).logits, tuned, atol=1e-5, rtol=1e-4, msg=name)
        in_model = {id(m) for m in merged.modules()}
        assert all(id(m) in in_model for m in hp.patching.describe_modules(merged)), name
        merged.save_pretrained(tmp_path / name)
        expected[name] = tuned
        cells[name] = (str(tmp_path / name), "causal" if arch in CAUSAL else "masked", x.tolist())
    result = tmp_path / "logits.pt"
    subprocess.run([sys.executable, "-c", RELOAD, json.dumps(cells), str(result)], check=True, timeout=600)
    reloaded = torch.load(result)
    for name, logits in expected.items():
        torch.testing.assert_close(torch.tensor(reloaded[name]), logits, atol=1e-5, rtol=1e-4, msg=name)


# ------------------------------------------------------------------ fp16 at long lengths


@row(scope(sites=("qk", "attention")), per_label=1)
def test_fp16_stays_finite_and_close_to_fp32(arch, label):
    """A 512-token forward in fp16 (8x the tiny table, 32x xPos's scale_base of 16 here) is finite and
    near fp32."""
    x = ids(batch=1, length=TINY["positions"] if keeps_table(arch, label) else 512, seed=6)
    with torch.no_grad():
        full = patched(arch, label)(x).logits
        half = patched(arch, label).half()(x).logits
    assert torch.isfinite(half).all()
    # fp16 matmuls over 512 keys of a peaky tiny model drift by a few percent; a broken decay is inf or NaN
    assert float((half.float() - full).abs().max()) < 0.2 * float(full.abs().max())


def site_logits(model: torch.nn.Module, label: str, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                k_pos: torch.Tensor) -> torch.Tensor:
    """q.k logits as the patched model computes them for these positions: the attention-site module, or
    the model's rotary module (its own, rebuilt, or the patch's) rotating q and k."""
    base = model.base_model
    if site_of(label) == "attention":
        return base.get_submodule("posenc_attention")(q, k, q_pos, k_pos)
    rotary = base.get_submodule("posenc_rotary" if hasattr(base, "posenc_rotary") else "rotary_emb")
    ref = torch.empty(0, dtype=q.dtype)
    rq = rotate(q.transpose(1, 2), *rotary(ref, q_pos)).transpose(1, 2)
    rk = rotate(k.transpose(1, 2), *rotary(ref, k_pos)).transpose(1, 2)
    return rq @ rk.transpose(-1, -2)


@row(scope(sites=("qk", "attention")), per_label=1)
def test_fp16_logits_at_16k_tokens_with_default_options(arch, label):
    """Every q/k-rotating scheme (xPos and Self-Extend with their defaults) at 16k tokens in fp16: the last
    queries against every key through the site's own computation (a 16k forward needs O(L^2) memory)."""
    defaults = {k: v for k, v in SCHEMES[label].items() if k == "layers"}
    options = defaults if scheme_of(label) in ("xpos", "self_extend") else SCHEMES[label]
    model = hp.patch(tiny_model(arch).half(), scheme_of(label), **options)
    length, heads, head_dim = 16384, TINY["heads"], TINY["hidden"] // TINY["heads"]
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(1, heads, 8, head_dim, generator=generator).half()
    k = torch.randn(1, heads, length, head_dim, generator=generator).half()
    k_pos = torch.arange(length)[None]
    logits = site_logits(model, label, q, k, k_pos[:, -8:], k_pos)
    assert torch.isfinite(logits).all()
    assert float(logits.float().abs().max()) < 1e3


@pytest.mark.parametrize("label,training,calls", [("alibi", True, 1), ("t5", False, 1), ("t5", True, 2)])
def test_a_bias_is_built_once_per_forward_unless_it_trains(label, training, calls):
    """Layers share one biased mask per forward (as transformers builds one mask), except when the bias
    has weights to train: each layer then builds its own, so gradient checkpointing can recompute it."""
    model = patched("llama", label).train(training)
    seen = []
    model.base_model.posenc_bias.register_forward_hook(lambda *args: seen.append(1))
    with torch.set_grad_enabled(training):
        model(ids())
    assert len(seen) == calls
