"""Contracts of transformers a patched model keeps (DESIGN, lessons of the third audit): what transformers' own
model tests found on patched models, as rows of the invariant matrix so it stays found.

One config per patched instance; a saved config reads as its own class; `len(cache)` is the number of layers;
the attention implementation is transformers' own name and switches; `output_attentions` works from the
config; fullgraph compile with a static cache; every input shape (multiple choice) and cross-attention.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import DynamicCache, GenerationConfig
from transformers.generation.configuration_utils import CompileConfig

import hf_posenc as hp
from hf_posenc.schemes.concat import embedding_split
from conftest import TINY, TINY_CONFIGS, tiny_model
from matrix import ATOL, CELLS, SCHEMES, focus, ids, patched, row, scheme_of, scope, site_of

pytestmark = pytest.mark.usefixtures("self_check_forced")

POSITIONED_ATTENTION = ("score", "attention")  # sites whose term runs in the posenc attention function


@row(CELLS, per_label=1)
def test_patching_one_model_leaves_its_config_and_every_other_model_alone(arch, label):
    """transformers hands one config object to every model built from it: the patch writes only its own copy."""
    config = TINY_CONFIGS[arch]()
    config.initializer_range = 0.2
    torch.manual_seed(0)
    model_cls = type(tiny_model(arch))
    a, b = model_cls(config).eval(), model_cls(config).eval()
    assert a.config is b.config is config
    before, x = config.to_dict(), ids()
    expected = b(x).logits
    hp.patch(a, scheme_of(label), **SCHEMES[label])
    assert config.to_dict() == before and not hasattr(config, "posenc")
    assert a.config is not config and b.config is config
    torch.testing.assert_close(b(x).logits, expected, atol=0, rtol=0)
    fresh = model_cls(config).eval()  # built after the patch, from the caller's config: stock
    assert hp.describe(fresh) is None and fresh(x).logits.isfinite().all()
    assert model_cls._from_config(a.config)(x).logits.shape == expected.shape


@row(CELLS, per_label=1)
def test_a_saved_config_reads_as_its_own_config_class(arch, label, tmp_path):
    """Reading a patched folder's config.json with the stock config class gives the model's own config (the nested
    `posenc` dict once carried a model_type, which transformers took for the config itself)."""
    model = patched(arch, label)
    model.save_pretrained(tmp_path)
    read = type(model.config).from_pretrained(tmp_path)
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        assert getattr(read, field) == getattr(model.config, field)
    assert read.posenc["scheme"] == scheme_of(label)


@row(scope(causal=True), per_label=1)
def test_a_cache_holds_one_layer_per_layer(arch, label):
    """`len(past_key_values)` is the number of layers, also when a user's cache is handed in."""
    model = patched(arch, label)
    out = model(ids(), use_cache=True)
    cache = out.past_key_values
    assert len(cache) == model.config.num_hidden_layers
    own = DynamicCache(config=model.config)
    model(ids(), past_key_values=own, use_cache=True)
    assert len(own) == model.config.num_hidden_layers


@row(CELLS, cells=focus(CELLS, sites=POSITIONED_ATTENTION))
def test_the_attention_implementation_is_transformers_own_and_switches(arch, label):
    """The model's config names sdpa or eager, never a name of hf-posenc's; switching keeps the scheme (eager ==
    sdpa), and `output_attentions` set on the config works under eager as on a stock model."""
    model = patched(arch, label)
    x = ids()
    assert model.config._attn_implementation == "sdpa"
    expected = model(x).logits
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(model(x).logits, expected, atol=ATOL, rtol=1e-4)
    model.config.output_attentions = True
    attentions = model(x).attentions
    assert len(attentions) == model.config.num_hidden_layers
    assert all(torch.allclose(a.sum(-1), torch.ones(())) for a in attentions)
    if site_of(label) in POSITIONED_ATTENTION and "layers" not in SCHEMES[label]:
        with pytest.raises(hp.PosEncError, match="choose one of 'sdpa', 'eager'"):
            model.set_attn_implementation("flex_attention")
    assert model.config._attn_implementation == "eager"


COMPILED: list[int] = []  # one entry per graph `inductor_counted` compiles (generate deep-copies its backend)


def inductor_counted(graph: torch.fx.GraphModule, example_inputs: list, **options: object) -> object:
    """A torch.compile backend: inductor, counting the graphs (`mode` and other options are generate's)."""
    from torch._inductor.compile_fx import compile_fx

    COMPILED.append(1)
    return compile_fx(graph, example_inputs)


def _compile_cells() -> list[tuple[str, str]]:
    return [("llama", label) for label in ("alibi", "t5", "xpos", "rope", "cope", "alibi-l1")] + [("gpt2", "alibi")]


@row(_compile_cells())
def test_fullgraph_compiled_static_cache_generate_equals_eager(arch, label):
    """The compiled decoding step (fullgraph, static shapes) has no data-dependent branch on positions and compiles
    once: the positions of a static cache's keys are kept for every slot, and its length is never read as a number
    (it grows each step: a guard on it recompiled every step). A left-padded batch decodes as the eager model does,
    and a second batch of the same shape runs the same graph."""
    model = patched(arch, label)
    x, other = ids(batch=2, length=6), ids(batch=2, length=6, seed=5)
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    greedy = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    references = [model.generate(prompt, attention_mask=mask, **greedy) for prompt in (x, other)]
    COMPILED.clear()
    compile_config = CompileConfig(fullgraph=True, dynamic=False, backend=inductor_counted)
    compile_config._compile_all_devices = True  # compile on the CPU too, as transformers' own test does
    config = GenerationConfig(**greedy, cache_implementation="static", compile_config=compile_config)
    torch._dynamo.reset()
    compiled = [model.generate(prompt, attention_mask=mask, generation_config=config) for prompt in (x, other)]
    assert len(COMPILED) == 1, f"compiled decoding compiled {len(COMPILED)} graphs for 6 steps"
    for got, reference in zip(compiled, references):
        assert torch.equal(got, reference)


MULTIPLE_CHOICE = {"gpt2": transformers.GPT2DoubleHeadsModel, "bert": transformers.BertForMultipleChoice,
                   "roberta": transformers.RobertaForMultipleChoice}


@row([c for c in CELLS if c[0] in MULTIPLE_CHOICE], per_label=1)
def test_multiple_choice_inputs_equal_their_rows_alone(arch, label):
    """(batch, choices, seq) ids, which the model flattens: each choice's positions are its own row's."""
    config = TINY_CONFIGS[arch]()
    config.initializer_range = 0.2
    torch.manual_seed(0)
    model = hp.patch(MULTIPLE_CHOICE[arch](config).eval(), scheme_of(label), **SCHEMES[label])
    x = ids(batch=6, length=9).view(2, 3, 9)
    mask = torch.ones_like(x)
    mask[0, 1, -3:] = 0
    hidden: list[torch.Tensor] = []
    model.base_model.register_forward_hook(lambda m, a, out: hidden.append(out[0]) and None)
    model(x, attention_mask=mask)
    model.base_model(x.view(6, 9), attention_mask=mask.view(6, 9))
    valid = mask.view(6, 9).bool()
    torch.testing.assert_close(hidden[0].view(6, 9, -1)[valid], hidden[1][valid], atol=ATOL, rtol=1e-4)


CROSS = {"gpt2": (transformers.GPT2LMHeadModel, {"add_cross_attention": True}),
         "bert": (transformers.BertLMHeadModel, {"add_cross_attention": True, "is_decoder": True})}


@row([c for c in CELLS if c[0] in CROSS], per_label=1)
def test_cross_attention_on_encoder_states_stays_stock(arch, label):
    """A decoder with cross-attention (an EncoderDecoderModel's): its self-attention takes the scheme, its
    cross-attention over the encoder's states runs the stock attention; cached decoding equals the full forward."""
    model_cls, fields = CROSS[arch]
    config = TINY_CONFIGS[arch]()
    for field, value in {**fields, "initializer_range": 0.2}.items():
        setattr(config, field, value)
    torch.manual_seed(0)
    model = hp.patch(model_cls(config).eval(), scheme_of(label), **SCHEMES[label])
    x, states = ids(length=8), torch.randn(2, 5, TINY["hidden"], generator=torch.Generator().manual_seed(2))
    calls = []
    crosses = [m for name, m in model.named_modules() if name.endswith(("crossattention", "crossattention.self"))]
    handles = [cross.register_forward_hook(lambda m, a, k, out: calls.append((m, a, k, out[0])) and None,
                                           with_kwargs=True) for cross in crosses]
    full = model(x, encoder_hidden_states=states).logits
    for handle in handles:
        handle.remove()
    assert crosses and len(calls) == len(crosses)
    for module, args, kwargs, out in calls:  # the module alone, with none of the patch's kwargs: the stock result
        public = {k: v for k, v in kwargs.items() if not k.startswith("posenc_")}
        torch.testing.assert_close(module(*args, **public)[0], out, atol=0, rtol=0)
    prefix = model(x[:, :5], encoder_hidden_states=states, use_cache=True)
    step = model(x[:, 5:], encoder_hidden_states=states, past_key_values=prefix.past_key_values).logits
    torch.testing.assert_close(step, full[:, 5:], atol=ATOL, rtol=1e-4)


@row(scope(causal=True), per_label=1)
def test_patching_a_peft_wrapped_model_patches_the_model_inside(arch, label):
    """peft's wrapper has its tuner as `base_model`: the patch goes into the transformers model inside, and
    equals the patched model wrapped; unpatch through the wrapper gives the stock logits back."""
    peft = pytest.importorskip("peft")
    x = ids()
    model = tiny_model(arch)
    torch.manual_seed(7)  # the scheme's own modules draw their init
    expected = hp.patch(model, scheme_of(label), **SCHEMES[label])(x).logits
    stock = tiny_model(arch)
    before = stock(x).logits
    wrapped = peft.get_peft_model(stock, peft.LoraConfig(target_modules=["q_proj", "c_attn"]))
    torch.manual_seed(7)
    assert hp.patch(wrapped, scheme_of(label), **SCHEMES[label]) is wrapped
    assert hp.describe(wrapped).scheme == scheme_of(label) if "layers" not in SCHEMES[label] else hp.describe(wrapped)
    torch.testing.assert_close(wrapped(x).logits, expected, atol=ATOL, rtol=1e-4)
    hp.unpatch(wrapped)
    assert hp.describe(wrapped) is None
    torch.testing.assert_close(wrapped(x).logits, before, atol=0, rtol=0)


@row([c for c in CELLS if scheme_of(c[1]) == "concat"])
def test_built_on_meta_and_initialised_the_concat_split_comes_from_the_initialised_embeddings(arch, label):
    """A model built on the meta device and initialised with nothing loaded (`to_empty` + `init_weights`, training
    from scratch): concat's saved token/position split is derived from the embeddings the init just drew, as a patch
    of that model would derive it (it was the ones the meta patch stood in, then uninitialised memory)."""
    with torch.device("meta"):
        meta = patched(arch, label)
    meta.to_empty(device="cpu")
    torch.manual_seed(3)
    meta.init_weights()
    (split,) = [m for m in meta.modules() if hasattr(m, "token_basis")]
    token_basis, position_basis, _ = embedding_split(meta.get_input_embeddings().weight.detach(),
                                                     split.position_basis.shape[1])
    torch.testing.assert_close(split.token_basis, token_basis.to(split.token_basis.dtype), atol=0, rtol=0)
    torch.testing.assert_close(split.position_basis, position_basis.to(split.position_basis.dtype), atol=0, rtol=0)
    assert meta.eval()(ids()).logits.isfinite().all()


def test_concat_on_a_vocabulary_smaller_than_the_width_still_adds_positions():
    """A task model of a few symbols (vocabulary 12 < width 64, as the length-generalisation study's): the SVD of its
    embeddings has 12 directions only; the position basis is still `d_pos` wide, orthogonal to the token basis. It
    was empty, so the code added nothing: one repeated token then gives the same output at every position (a
    causal average of equal values), as with no positions at all."""
    config = transformers.GPT2Config(vocab_size=12, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                     initializer_range=0.2)
    torch.manual_seed(0)
    model = hp.patch(transformers.GPT2LMHeadModel(config).eval(), "concat", d_pos=16)
    (split,) = [m for m in model.modules() if hasattr(m, "token_basis")]
    assert split.position_basis.shape == (64, 16) and split.token_basis.shape == (64, 48)
    both = torch.cat([split.token_basis, split.position_basis], dim=1).float()
    torch.testing.assert_close(both.T @ both, torch.eye(64), atol=1e-5, rtol=0)
    logits = model(torch.full((1, 8), 5)).logits[0]
    assert (logits[1:] - logits[0]).abs().amax() > 1e-2  # the positions tell the copies of one token apart


ROTARY = ("llama", "mistral", "qwen2", "qwen3")  # models that rotate, with `rope_parameters` in their config
SCALINGS = ({"rope_type": "linear", "factor": 10.0}, {"rope_type": "dynamic", "factor": 10.0},
            {"rope_type": "yarn", "factor": 10.0})


@row([c for c in CELLS if c[0] in ROTARY and c[1] in ("alibi", "nope", "t5")], per_label=1)
def test_rope_scaling_in_the_config_is_inert_where_the_scheme_removes_the_rotation(arch, label):
    """The documented departure (docs/testing.md): a scheme that removes the rotation leaves nothing for the
    config's `rope_parameters` scaling to act on, so the patched model's logits are the same with and without it
    (transformers' own rope-scaling tests expect them to change), while the stock model's do change."""
    x = ids(batch=1, length=TINY["positions"] * 3 // 2)  # past the trained length: dynamic scaling acts there

    def logits(scaling: dict | None, patch: bool) -> torch.Tensor:
        config = TINY_CONFIGS[arch]()
        config.initializer_range = 0.2
        if scaling:
            config.rope_parameters = {**config.rope_parameters, **scaling}
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        torch.manual_seed(1)  # the scheme's own modules draw the same init
        return (hp.patch(model, scheme_of(label), **SCHEMES[label]) if patch else model)(x).logits

    plain, stock = logits(None, True), logits(None, False)
    for scaling in SCALINGS:
        torch.testing.assert_close(logits(scaling, True), plain, atol=0, rtol=0)
        assert not torch.allclose(logits(scaling, False), stock, atol=1e-5), scaling
