"""Encoder-decoder rows of the invariant matrix (issue 19): T5, BART, mBART, Marian, Pegasus, M2M100 and
Whisper's text decoder, tiny and peaky (tests/seq2seq_models.py), every scheme, against stock models,
references and each other. Cheap rows run on every supported (family, scheme) cell; the others on a
sample in which every scheme and every family of their scope appears (`ROWS`; tests/test_meta.py checks it)."""

from __future__ import annotations

import copy
import inspect
import io
import math
from typing import Callable

import pytest
import torch
import transformers

import hf_posenc as hp
from hf_posenc.attention import PREFIX
from hf_posenc.seq2seq import cross_attentions, stack_adapter, stack_module, text_stacks
from matrix import ABSOLUTE, FROM_WEIGHTS, SCHEMES, layers_validate, scheme_of
from matrix import sample as sample_of_scope
from seq2seq_models import OWN, SEQ2SEQ, encoder_inputs, tiny_seq2seq

FAMILIES = tuple(SEQ2SEQ)
SUPPORTED = {family: set(hp.catalog.supported_schemes(tiny_seq2seq(family))) for family in FAMILIES}
STACKS = {family: text_stacks(tiny_seq2seq(family)) for family in FAMILIES}  # the stacks a patch takes


def supported(family: str, label: str) -> bool:
    """The scheme is supported, and a per-layer label's layers validate too (T5's shared bias and the learned or
    sinusoidal tables at a stack's input take no partial patch, by name)."""
    return scheme_of(label) in SUPPORTED[family] and ("layers" not in SCHEMES[label]
                                                      or layers_validate(tiny_seq2seq(family), label))


def relative(family: str, label: str) -> bool:
    """A shift of positions changes nothing: a relative scheme, and for a per-layer label the family's own
    positions in the other layers relative too."""
    return label not in ABSOLUTE and not ("layers" in SCHEMES[label] and OWN[family] in ABSOLUTE)


CELLS = [(f, label) for f in FAMILIES for label in SCHEMES if supported(f, label)]
# schemes whose modules have weights (peft's modules_to_save trains them)
TRAINABLE = {"learned", "concat-learned", "untied", "t5", "fire", "kerple", "fope", "pope", "cope"}
TRAINABLE_CELLS = [c for c in CELLS if c[1] in TRAINABLE]
# row name -> (the cells in its scope, the cells it runs), as matrix.ROWS for the causal matrix
ROWS: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {}


def row(scope: list[tuple[str, str]], cells: list[tuple[str, str]] | None = None) -> Callable:
    """Parametrize a test over (family, label) cells (all of `scope`, or the given ones) and register it as a
    row of the seq2seq matrix."""
    cells = scope if cells is None else cells

    def register(test: Callable) -> Callable:
        ROWS[test.__name__] = (scope, cells)
        return pytest.mark.parametrize("family,label", cells, ids=[f"{f}-{label}" for f, label in cells])(test)

    return register


def sample(cells: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each scheme label once, on families taken in rotation (the next one that supports it): every scheme and
    every family appear."""
    out = []
    for i, label in enumerate(SCHEMES):
        families = [FAMILIES[(i + j) % len(FAMILIES)] for j in range(len(FAMILIES))]
        family = next((f for f in families if (f, label) in cells), None)
        if family is not None:
            out.append((family, label))
    return out


SAMPLE = sample(CELLS)


def moves(family: str, label: str) -> bool:
    """The patch changes the stock logits: not the family's own scheme, nor `learned` (it copies the table)."""
    return scheme_of(label) != OWN[family] and not (label == "learned" and family != "t5")


def patched(family: str, label: str, attn: str = "sdpa", **extra) -> torch.nn.Module:
    model = tiny_seq2seq(family, attn)
    return hp.patch(model, scheme_of(label), **{**SCHEMES[label], **extra})


def decoder_ids(batch: int = 2, length: int = 6, seed: int = 2) -> torch.Tensor:
    return torch.randint(3, 120, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model: torch.nn.Module, **inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def assert_close_at_scale(got: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5) -> None:
    """Within `rel` of the logits' scale: T5's unscaled logits (~30 here) round at 1e-4 in fp32 wherever a
    batch pads differently, stock model included."""
    assert (got - expected).abs().max() <= rel * expected.abs().max(), (got - expected).abs().max()


def test_the_sample_covers_every_scheme_and_family():
    assert {scheme_of(label) for _, label in SAMPLE} == {scheme_of(label) for _, label in CELLS}
    assert {f for f, _ in SAMPLE} == set(FAMILIES)
    assert {scheme_of(label) for f, label in CELLS} >= {"t5", "rope", "alibi", "nope", "learned", "sinusoidal"}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@row([(f, OWN[f]) for f in FAMILIES])
def test_own_scheme_equals_the_stock_model(family, label, attn):
    """T5's buckets copied with its bucket count and max distance, BART's table with offset 2, Marian/Pegasus'
    halved and M2M100's fairseq sinusoids: patching the family's own scheme gives back its logits."""
    model = tiny_seq2seq(family, attn)
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    expected = logits(model, **inputs)
    hp.patch(model, label)
    assert hp.describe(model).scheme == label
    # within 1e-5 of the logits' scale: fp32 rounding only (T5 eager sums bias and mask in another order:
    # 1e-4 on logits of ~30; every other cell is closer)
    assert (logits(model, **inputs) - expected).abs().max() <= 1e-5 * expected.abs().max()


@row(CELLS)
def test_patch_moves_logits_and_unpatch_is_bit_exact(family, label):
    model = tiny_seq2seq(family)
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = logits(model, **inputs)
    hp.patch(model, scheme_of(label), **SCHEMES[label])
    assert hp.describe(model).stacks == STACKS[family]
    moved = (logits(model, **inputs) - expected).abs().max()
    if moves(family, label):
        assert moved > 1e-2, f"{family}-{label} changed nothing"
    hp.unpatch(model)
    assert hp.describe(model) is None and getattr(model.config, "posenc", None) is None
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(logits(model, **inputs), expected)


def cross_attention_calls(model: torch.nn.Module, inputs: dict) -> list[tuple]:
    """(module, args, kwargs, output) of every cross-attention call in one forward."""
    calls, handles = [], []
    decoder = stack_module(model, "decoder")
    for module in cross_attentions(decoder, stack_adapter(model, "decoder")):
        def record(m, args, kwargs, out):
            calls.append((m, args, {k: v for k, v in kwargs.items() if not k.startswith(PREFIX)}, out[0].detach()))
        handles.append(module.register_forward_hook(record, with_kwargs=True))
    with torch.no_grad():
        model(**inputs, use_cache=False)
    for handle in handles:
        handle.remove()
    return calls


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@row(CELLS, SAMPLE)
def test_cross_attention_is_untouched(family, label, attn):
    """Given the inputs the patched model hands its cross-attention, the stock module gives the same output:
    no bias, rotation or position reaches it (the decoder's inputs to it do change)."""
    model = patched(family, label, attn)
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    if "input_ids" in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        inputs["attention_mask"][0, -3:] = 0
    calls = cross_attention_calls(model, inputs)
    assert len(calls) == 2  # one per decoder layer
    hp.unpatch(model)
    for module, args, kwargs, out in calls:
        name = "mask" if "mask" in kwargs else "attention_mask"  # T5 names it `mask`
        mask = kwargs.get(name)
        if attn == "eager" and mask is not None and mask.dtype == torch.bool:
            # posenc_* builds sdpa's bool masks; the stock eager model had the same mask as an additive float one
            kwargs[name] = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        with torch.no_grad():
            stock = module(*args, **kwargs)[0]
        # sdpa: the very same call, bit for bit; eager: hf-posenc's eager function instead of the model's (fp32
        # rounding, within 1e-5 of the outputs' scale)
        if attn == "sdpa":
            assert torch.equal(stock, out)
        else:
            assert_close_at_scale(out, stock)


def padded_batch(model: torch.nn.Module) -> dict:
    """Two encoder rows, the second right-padded by 3 (BART-style tokenizers pad on the right)."""
    inputs = encoder_inputs(model, length=9)
    if "input_ids" in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        inputs["attention_mask"][1, -3:] = 0
        inputs["input_ids"][1, -3:] = model.config.pad_token_id
    return inputs


@row(CELLS, SAMPLE)
def test_generate_greedy_and_beam_cached_uncached_static_agree(family, label):
    model = patched(family, label)
    inputs = padded_batch(model)
    common = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=model.config.pad_token_id)
    for beams in (1, 2):
        runs = {cache: model.generate(**inputs, **common, num_beams=beams, use_cache=cache != "none",
                                      **({"cache_implementation": "static"} if cache == "static" else {}))
                for cache in ("dynamic", "none", "static")}
        assert torch.equal(runs["dynamic"], runs["none"]), (family, label, beams)
        assert torch.equal(runs["dynamic"], runs["static"]), (family, label, beams)


@row([c for c in CELLS if "encoder" in STACKS[c[0]]])  # a text encoder
def test_a_padded_encoder_row_equals_the_input_alone(family, label):
    model = patched(family, label)
    inputs = padded_batch(model)
    dec = decoder_ids()
    batched = logits(model, **inputs, decoder_input_ids=dec)
    alone = logits(model, input_ids=inputs["input_ids"][1:, :-3], decoder_input_ids=dec[1:])
    # T5 scales no attention logits: in these peaky tiny models fp32 rounding of a padded batch reaches 1e-4 of
    # the logits' scale (2e-4 on logits of ~30 in the stock model) and up to 6e-4 under learned biases
    assert_close_at_scale(batched[1:], alone, rel=1e-3 if family == "t5" else 1e-5)


@row([(f, label) for f, label in CELLS if relative(f, label)
     and "decoder_position_ids" in inspect.signature(SEQ2SEQ[f][1].forward).parameters])
def test_shifted_decoder_position_ids_are_a_no_op_for_relative_schemes(family, label):
    """Families whose forward takes explicit `decoder_position_ids` (Whisper): a constant shift changes nothing
    relative (6: a multiple of Self-Extend's group of 2, whose grouped positions floor(p / group) shift by whole
    steps)."""
    model = patched(family, label)
    inputs, dec = encoder_inputs(model), decoder_ids()
    counted = torch.arange(dec.shape[1]).expand(2, -1)
    plain = logits(model, **inputs, decoder_input_ids=dec, decoder_position_ids=counted)
    torch.testing.assert_close(logits(model, **inputs, decoder_input_ids=dec), plain, atol=1e-5, rtol=1e-5)
    shifted = logits(model, **inputs, decoder_input_ids=dec, decoder_position_ids=counted + 6)
    torch.testing.assert_close(shifted, plain, atol=1e-4, rtol=1e-4)


def test_shifted_decoder_position_ids_move_an_absolute_scheme():
    model = patched("whisper", "learned")
    inputs, dec = encoder_inputs(model), decoder_ids()
    counted = torch.arange(dec.shape[1]).expand(2, -1)
    plain = logits(model, **inputs, decoder_input_ids=dec, decoder_position_ids=counted)
    assert (logits(model, **inputs, decoder_input_ids=dec, decoder_position_ids=counted + 5) - plain).abs().max() > 1e-2


@row(CELLS, SAMPLE)
def test_sdpa_equals_eager(family, label):
    out = {}
    for attn in ("sdpa", "eager"):
        model = patched(family, label, attn)
        out[attn] = logits(model, **padded_batch(model), decoder_input_ids=decoder_ids())
    assert_close_at_scale(out["sdpa"], out["eager"])


@row(CELLS, SAMPLE)
def test_save_pretrained_reloads_bit_identical_with_hf_posenc_and_the_auto_class(family, label, tmp_path):
    model = patched(family, label)
    with torch.no_grad():  # the scheme's own weights differ from any init
        for module in hp.patching.describe_modules(model):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    expected = logits(model, **inputs)
    model.save_pretrained(tmp_path)
    auto = transformers.AutoModelForSpeechSeq2Seq if family == "whisper" else transformers.AutoModelForSeq2SeqLM
    for reloaded in (hp.from_pretrained(str(tmp_path), model_cls=auto),
                     auto.from_pretrained(str(tmp_path), trust_remote_code=True)):
        assert hp.describe(reloaded) == hp.describe(model)
        assert torch.equal(logits(reloaded.eval(), **inputs), expected)


META_CELLS = [c for c in CELLS if c[1] not in FROM_WEIGHTS]


@row(META_CELLS, sample(META_CELLS))
def test_built_on_meta_then_init_weights_gives_the_patch_its_buffers(family, label):
    """`to_empty` + `init_weights` of a patch built on the meta device re-derives its buffers (T5's zeroed buckets)."""
    model = patched(family, label)
    with torch.device("meta"):
        meta = patched(family, label)
    meta.to_empty(device="cpu")
    meta.init_weights()
    meta.load_state_dict(model.state_dict())
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    assert torch.equal(logits(meta.eval(), **inputs), logits(model, **inputs))


@row(TRAINABLE_CELLS, sample_of_scope(TRAINABLE_CELLS))
def test_peft_lora_with_modules_to_save_trains_each_stacks_new_modules(family, label):
    import peft

    from hf_posenc.integrations.lora import modules_to_save

    model = patched(family, label)
    saved = modules_to_save(model)
    assert len(saved) == len(STACKS[family]), saved  # one per patched stack
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"] if family != "t5" else ["q", "v"],
                             modules_to_save=[name.rsplit(".", 1)[-1] for name in saved], init_lora_weights=False)
    wrapped = peft.get_peft_model(model, config)
    trained = [m for m in hp.patching.describe_modules(wrapped) if any(True for _ in m.parameters())]
    assert len(trained) == len(saved)
    start = [[p.detach().clone() for p in m.parameters()] for m in trained]
    inputs = {**encoder_inputs(model), "labels": decoder_ids()}
    optimizer = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=0.05)
    wrapped.train()
    for _ in range(2):
        optimizer.zero_grad()
        wrapped(**inputs).loss.backward()
        # every module learns; not every parameter: a constant per-head bias (FIRE's last bias) leaves softmax as
        # it is, so its gradient is zero up to rounding
        assert all(any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters()) for m in trained)
        optimizer.step()
    assert all(any(not torch.equal(a, b.detach()) for a, b in zip(before, m.parameters()))
               for before, m in zip(start, trained))


@row(CELLS, SAMPLE)
def test_deepcopy_and_torch_save_keep_an_independent_working_patch(family, label):
    model = patched(family, label)
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    expected = logits(model, **inputs)
    twin = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (twin, loaded):
        assert hp.describe(other) == hp.describe(model)
        assert torch.equal(logits(other, **inputs), expected)
    hp.unpatch(twin)
    assert torch.equal(logits(model, **inputs), expected)  # the original keeps its patch
    assert not torch.equal(logits(twin, **inputs), expected) or not moves(family, label)


def t5_bucket_reference(relative: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Raffel et al. 2020 (sec. 2.1; mesh-tensorflow's _relative_position_bucket), one integer at a time:
    `relative` = key position - query position."""
    bucket, n = 0, -relative
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(large, num_buckets - 1)


def bias_from_formula(table: torch.Tensor, length: int, bidirectional: bool, buckets: int, distance: int) -> torch.Tensor:
    rows = [[table[t5_bucket_reference(k - q, bidirectional, buckets, distance)] for k in range(length)]
            for q in range(length)]
    return torch.stack([torch.stack(r) for r in rows]).permute(2, 0, 1)[None]  # (1, H, q, k)


def test_a_bart_base_checkpoint_loads_into_the_model_with_a_head_and_back(tmp_path):
    """BartModel <-> BartForConditionalGeneration: the patch's weights of both stacks cross the `model.` prefix."""
    inputs = {"input_ids": encoder_inputs(tiny_seq2seq("bart"))["input_ids"], "decoder_input_ids": decoder_ids()}
    saved = {}
    for name, cls in (("base", transformers.BartModel), ("head", transformers.BartForConditionalGeneration)):
        torch.manual_seed(0)
        model = hp.patch(cls._from_config(SEQ2SEQ["bart"][0]()).eval(), "fire", init="random")
        with torch.no_grad():
            for module in hp.patching.describe_modules(model):
                for p in module.parameters():
                    p.add_(torch.randn_like(p) * 0.1)
        model.save_pretrained(tmp_path / name)
        saved[name] = model
    for source, into in (("base", transformers.BartForConditionalGeneration), ("head", transformers.BartModel)):
        loaded = hp.from_pretrained(str(tmp_path / source), model_cls=into).eval()
        with torch.no_grad():
            got = loaded.get_decoder()(inputs["decoder_input_ids"],
                                       encoder_hidden_states=loaded.get_encoder()(inputs["input_ids"])[0])[0]
            stack = saved[source]
            want = stack.get_decoder()(inputs["decoder_input_ids"],
                                       encoder_hidden_states=stack.get_encoder()(inputs["input_ids"])[0])[0]
        assert torch.equal(got, want)
        weights = [[t for m in hp.patching.describe_modules(x) for t in m.state_dict().values()] for x in (loaded, stack)]
        assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_t5_on_bart_equals_a_forward_written_from_the_bucket_formula():
    """The patched model against stock BART run with no positions (zero tables) and the T5 bias of each
    stack (bidirectional buckets in the encoder, causal in the decoder) handed in as 4-D float masks."""
    options = dict(init_std=0.5, num_buckets=16, max_distance=24)
    model = patched("bart", "t5", attn="eager", **options)
    x, dec = encoder_inputs(model, batch=1, length=40)["input_ids"], decoder_ids(batch=1, length=30)
    got = logits(model, input_ids=x, decoder_input_ids=dec)
    tables = {s: model.model.get_submodule(f"{s}.posenc_bias").relative_attention_bias.weight.detach()
              for s in ("encoder", "decoder")}
    stock = tiny_seq2seq("bart", "eager")
    with torch.no_grad():
        for stack in (stock.model.encoder, stock.model.decoder):
            stack.embed_positions.weight.zero_()
        enc_bias = bias_from_formula(tables["encoder"], x.shape[1], True, 16, 24)
        dec_bias = bias_from_formula(tables["decoder"], dec.shape[1], False, 16, 24)
        future = torch.triu(torch.ones(dec.shape[1], dec.shape[1], dtype=torch.bool), 1)
        dec_bias = dec_bias.masked_fill(future, torch.finfo(torch.float32).min)
        encoded = stock.model.encoder(input_ids=x, attention_mask=enc_bias).last_hidden_state
        hidden = stock.model.decoder(input_ids=dec, attention_mask=dec_bias, encoder_hidden_states=encoded).last_hidden_state
        reference = stock.lm_head(hidden) + stock.final_logits_bias
    assert (got - logits(tiny_seq2seq("bart", "eager"), input_ids=x, decoder_input_ids=dec)).abs().max() > 1e-1
    torch.testing.assert_close(got, reference, atol=1e-4, rtol=1e-4)


def test_one_stack_patches_only_that_stack():
    model = tiny_seq2seq("bart")
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    with torch.no_grad():
        encoded = model.get_encoder()(**encoder_inputs(model)).last_hidden_state
    hp.patch(model, "alibi", stacks=("decoder",))
    assert hp.describe(model).stacks == ("decoder",) and model.config.posenc["stacks"] == ["decoder"]
    with torch.no_grad():
        assert torch.equal(model.get_encoder()(**encoder_inputs(model)).last_hidden_state, encoded)
    decoder_only = logits(model, **inputs)
    hp.patch(model, "alibi", stacks=["encoder"])
    with torch.no_grad():
        assert not torch.equal(model.get_encoder()(**encoder_inputs(model)).last_hidden_state, encoded)
    assert not torch.equal(logits(model, **inputs), decoder_only)
    # causal-only schemes fit the decoder stack alone
    assert not hp.supports(model, "xpos")
    hp.patch(model, "xpos", stacks="decoder")
    assert hp.describe(model).stacks == ("decoder",)


def test_seq2seq_mistakes_raise_and_leave_the_model_as_it_was():
    model = tiny_seq2seq("t5")
    hp.patch(model, "alibi")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = {**encoder_inputs(model), "decoder_input_ids": decoder_ids()}
    expected = logits(model, **inputs)
    cases = [
        (("rope",), {"theta": -1.0}, r"theta"),
        (("xpos",), {}, r"'t5' cannot take scheme 'xpos' \(encoder: 'xpos' needs a causal model\)"),
        (("rope",), {"stacks": ("encoder", "cross")}, r"stacks must be a non-empty list of 'encoder', 'decoder'"),
        (("rope",), {"stacks": []}, r"stacks must be a non-empty list"),
        (("t5",), {"init": "copy", "num_buckets": 16}, r"t5 init='copy' needs the model's own bucket table of shape \(16, 4\); this model has \(8, 4\)"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(hp.PosEncError, match=message):
            hp.patch(model, *args, **kwargs)
        assert hp.describe(model).scheme == "alibi"
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert torch.equal(logits(model, **inputs), expected)
    whisper = tiny_seq2seq("whisper")
    with pytest.raises(hp.PosEncError, match=r"'whisper': the encoder stack is out of scope \(WhisperEncoder has no "
                                             r"token embedding table: it reads 'input_features'.*patch stacks=\['decoder'\]"):
        hp.patch(whisper, "rope", stacks=("encoder", "decoder"))
    assert hp.describe(whisper) is None
    with pytest.raises(hp.PosEncError, match=r"stacks=\['decoder'\] applies to encoder-decoder models; 'gpt2' has one"):
        hp.patch(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2)), "rope",
                 stacks=("decoder",))

