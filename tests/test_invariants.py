"""DESIGN section 8: the invariants every supported architecture x scheme cell must pass (the matrix is
defined in matrix.py; the rows about the paths the ecosystem takes are in test_paths.py)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from transformers import DynamicCache

import hf_posenc as hp
from conftest import TINY, TINY_CONFIGS, tiny_model
from hf_posenc.catalog import adapter_for
from hf_posenc.schemes.alibi import AlibiBias
from hf_posenc import recording
from matrix import ATOL, CELLS, FROM_WEIGHTS, SCHEMES, TABLES, ids, patched, row, sample, scheme_of, scope

pytestmark = pytest.mark.usefixtures("self_check_forced")


@row(CELLS)
def test_unpatch_restores_original_logits_exactly(arch, label):
    model = tiny_model(arch)
    x = ids()
    before = model(x).logits
    hp.patch(model, scheme_of(label), **SCHEMES[label])
    changed = model(x).logits
    hp.unpatch(model)
    assert torch.equal(model(x).logits, before)
    rotates = arch in ("llama", "mistral", "qwen2", "qwen3")
    if not (label == "learned" and not rotates) and not (label == "dynamic" and rotates):
        # a copied learned table, or dynamic scaling within the trained length, is the original model
        assert not torch.allclose(changed, before, atol=1e-3), "patch had no effect"
    assert hp.describe(model) is None


@row(scope(causal=True))
def test_cached_equals_uncached(arch, label):
    model = patched(arch, label)
    x = ids(length=10)
    full = model(x).logits
    cache = DynamicCache(config=model.config)
    steps = [model(x[:, :6], past_key_values=cache, use_cache=True).logits]
    for t in range(6, 10):
        steps.append(model(x[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=1e-4)


@row(scope(causal=True))
def test_generate_cache_static_and_dynamic_agree(arch, label):
    model = patched(arch, label)
    x = ids(batch=1, length=8)
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True,
              pad_token_id=0, eos_token_id=None)
    dynamic = model.generate(x, use_cache=True, **kw)
    uncached = model.generate(x, use_cache=False, **kw)
    static = model.generate(x, use_cache=True, cache_implementation="static", **kw)
    assert torch.equal(dynamic.sequences, uncached.sequences)
    assert torch.equal(dynamic.sequences, static.sequences)
    for a, b, c in zip(dynamic.scores, uncached.scores, static.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
    # and generation continues the full forward's greedy choice
    first = model(x).logits[:, -1].argmax(-1)
    assert dynamic.sequences[0, 8] == first[0]


@row(CELLS)
def test_left_padded_row_equals_prompt_alone(arch, label):
    model = patched(arch, label)
    x = ids(batch=1, length=9)
    alone = model(x, attention_mask=torch.ones_like(x)).logits
    pad = 3
    padded = torch.cat((torch.zeros(1, pad, dtype=torch.long), x), dim=1)
    batch = torch.cat((padded, ids(batch=1, length=12, seed=5)))
    mask = torch.ones_like(batch)
    mask[0, :pad] = 0
    out = model(batch, attention_mask=mask).logits
    torch.testing.assert_close(out[0, pad:], alone[0], atol=ATOL, rtol=1e-4)


@row(CELLS)
def test_sdpa_equals_eager(arch, label):
    x = ids()
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    sdpa = patched(arch, label, attn="sdpa")(x, attention_mask=mask).logits
    eager = patched(arch, label, attn="eager")(x, attention_mask=mask).logits
    torch.testing.assert_close(sdpa[1], eager[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sdpa[0, 2:], eager[0, 2:], atol=1e-4, rtol=1e-4)


@row(CELLS)
def test_save_and_reload_gives_identical_logits(arch, label, tmp_path):
    model = patched(arch, label)
    with torch.no_grad():  # make the scheme's own weights differ from any init
        for module in hp.patching.describe_modules(model):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    x = ids()
    expected = model(x).logits
    model.save_pretrained(tmp_path)
    cls = type(model)
    reloaded = hp.from_pretrained(str(tmp_path), model_cls=cls).eval()
    assert hp.describe(reloaded) == hp.describe(model)
    torch.testing.assert_close(reloaded(x).logits, expected, atol=0, rtol=0)


META_SCOPE = [(arch, label) for arch, label in CELLS if label not in FROM_WEIGHTS]


@row(META_SCOPE, cells=[c for c in META_SCOPE if c[0] in ("llama", "gpt2")]
     + sample([c for c in META_SCOPE if c[0] not in ("llama", "gpt2")]))
def test_built_on_meta_then_init_weights_gives_the_patch_its_buffers(arch, label, tmp_path):
    """Big models and FSDP2 build on the meta device, then `to_empty` + `init_weights`: the patch's buffers (ALiBi
    slopes, xPos decays, kept pairs, frequencies, zero positions) come back as the patch computed them."""
    model = patched(arch, label)
    grown = getattr(model.config, "n_positions", None) != TINY_CONFIGS[arch]().to_dict().get("n_positions")
    if grown and isinstance(getattr(model.transformer.h[0].attn, "bias", None), torch.Tensor):
        pytest.skip("this transformers' GPT-2 init_weights refills each attention's causal `bias` buffer from "
                    "n_positions, which the patch raised (the buffer keeps the old size; transformers dropped it later)")
    with torch.no_grad():  # trained weights differ from any init
        for module in hp.patching.describe_modules(model):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    with torch.device("meta"):
        meta = patched(arch, label)
    meta.to_empty(device="cpu")
    meta.init_weights()
    meta.load_state_dict(model.state_dict())  # what a sharded checkpoint load gives: the saved weights only
    x = ids()
    expected = model(x).logits
    torch.testing.assert_close(meta.eval()(x).logits, expected, atol=0, rtol=0)
    meta.save_pretrained(tmp_path)
    reloaded = hp.from_pretrained(str(tmp_path), model_cls=type(model)).eval()
    torch.testing.assert_close(reloaded(x).logits, expected, atol=0, rtol=0)


def test_the_init_hook_is_plain_data_and_goes_with_the_patch():
    model = patched("llama", "alibi")
    hook = vars(model)["initialize_weights"]
    assert hook.func is recording.initialize_weights and hook.args == (model,)
    twin = copy.deepcopy(model)
    assert vars(twin)["initialize_weights"].args[0] is twin
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for copied in (twin, loaded):
        (bias,) = [m for m in copied.modules() if isinstance(m, AlibiBias)]
        slopes = bias.slopes.clone()
        bias.slopes.zero_()
        copied.init_weights()  # the copy's own init re-derives its own buffers
        assert torch.equal(bias.slopes, slopes)
    hp.unpatch(model)
    assert "initialize_weights" not in vars(model)


@row(CELLS)
def test_gradient_checkpointing_matches(arch, label):
    x = ids()

    def grads(checkpointing: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model = patched(arch, label).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        out = model(x, labels=x)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    loss, ref = grads(False)
    loss_ckpt, got = grads(True)
    torch.testing.assert_close(loss_ckpt, loss)
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=1e-4, msg=name)


@row(CELLS)
def test_inputs_past_the_original_table(arch, label):
    model = patched(arch, label)
    long = ids(batch=1, length=TINY["positions"] + 16)
    if label in TABLES:
        with pytest.raises(hp.PosEncError, match=r"length 80.*64 positions"):
            model(long)
    elif "layers" in SCHEMES[label] and adapter_for(model).slot:
        with pytest.raises((IndexError, RuntimeError)):  # a per-layer patch keeps the model's own table
            model(long)
    else:
        out = model(long).logits
        assert out.shape[1] == long.shape[1] and torch.isfinite(out).all()


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_repatching_equals_patching_a_fresh_model(arch):
    x = ids()
    twice = hp.patch(tiny_model(arch), "rope", theta=100.0)
    hp.patch(twice, "alibi")
    fresh = hp.patch(tiny_model(arch), "alibi")
    assert torch.equal(twice(x).logits, fresh(x).logits)
    hp.unpatch(twice)
    assert torch.equal(twice(x).logits, tiny_model(arch)(x).logits)


@pytest.mark.parametrize("arch,label", [("gpt2", "rope"), ("gpt2", "learned"), ("llama", "alibi"), ("bert", "yarn"),
                                        ("llama", "t5"), ("qwen3", "xpos"), ("llama", "self_extend"),
                                        ("llama", "concat"), ("gpt2", "p_rope"), ("llama", "fope"),
                                        ("llama", "pope"), ("llama", "cope")])
def test_torch_compile_fullgraph_matches(arch, label):
    torch._dynamo.reset()  # each cell compiles anew: a worker's earlier cells must not spend dynamo's recompile limit
    model = patched(arch, label)
    x = ids()
    expected = model(x).logits
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x).logits, expected, atol=1e-5, rtol=1e-4)


def compiled_scores(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy scores of `generate` plain and with a static cache, whose decoding forward generate compiles
    (as it does by itself on CUDA; backend eager: the graph dynamo keeps is what is tested, not a kernel)."""
    from transformers import CompileConfig

    compile_config = CompileConfig(backend="eager", mode=None)
    compile_config._compile_all_devices = True  # transformers' switch for compiling off CUDA
    greedy = dict(do_sample=False, max_new_tokens=4, pad_token_id=0, eos_token_id=None, output_scores=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        plain = model.generate(x, **greedy).scores
        compiled = model.generate(x, cache_implementation="static", compile_config=compile_config, **greedy).scores
    return torch.stack(plain), torch.stack(compiled)


@pytest.mark.parametrize("arch,label", [("llama", "nope-l1"), ("llama", "alibi"), ("gpt2", "alibi-l1")])
def test_a_graph_compiled_before_the_patch_is_not_replayed_for_it(arch, label):
    """dynamo skips guards on module hooks by default, so a graph compiled for the stock model was replayed
    for a patched one of the same class (on CUDA, nope on Llama's layer 1 decoded with the stock rotation):
    a patch turns those guards on. Here as in a fresh process: the stock model compiled first, then a patched
    one, the same model patched after its compile, and unpatched again."""
    import torch._dynamo

    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=True):  # torch's default, as a process starts
        torch._dynamo.reset()
        compiled_before_and_after_patches(arch, label)


def compiled_before_and_after_patches(arch: str, label: str) -> None:
    x = ids(length=8)
    stock = tiny_model(arch)
    plain, compiled = compiled_scores(stock, x)
    torch.testing.assert_close(compiled, plain, atol=1e-5, rtol=1e-4)
    for model in (patched(arch, label), hp.patch(stock, scheme_of(label), **SCHEMES[label])):
        plain, compiled = compiled_scores(model, x)
        torch.testing.assert_close(compiled, plain, atol=1e-5, rtol=1e-4)
    unpatched_plain, unpatched_compiled = compiled_scores(hp.unpatch(stock), x)
    assert not torch.allclose(unpatched_plain, plain, atol=1e-3)  # the patch changed what the model decodes
    torch.testing.assert_close(unpatched_compiled, unpatched_plain, atol=1e-5, rtol=1e-4)


def test_reload_a_checkpoint_with_head_as_a_bare_base_model(tmp_path):
    from transformers import GPT2Model

    model = hp.patch(tiny_model("gpt2"), "learned", init="interpolate", max_positions=100)
    model.save_pretrained(tmp_path)
    base = hp.from_pretrained(str(tmp_path), model_cls=GPT2Model).eval()
    x = ids(length=90)
    torch.testing.assert_close(base(x).last_hidden_state, model.transformer(x).last_hidden_state, atol=0, rtol=0)
