"""The zoo sweep: a tiny random model of every causal-LM model type of the installed transformers
(tests/zoo.py), the adapter each one gets, and the cells of the invariant matrix it claims.

benchmarks/results/zoo_catalog.json records what the sweep found (`benchmarks/zoo_catalog.py`
writes it); these tests fail when the code no longer does what the catalog says, so the support
table generated from it stays true. The fast run checks every type's adapter, `native` (its own scheme
== stock), yarn against transformers' own and one row per supported site in rotation; `-m slow` runs
every cell.
"""

from __future__ import annotations

import copy
import json
import zlib
from pathlib import Path

import pytest
import torch
import transformers

import hf_posenc as hp
import real_configs
import zoo
from conftest import tiny_model
from hf_posenc.adapters.discover import discover
from hf_posenc.adapters.generic import adapter_from
from hf_posenc.paths import MODEL_TYPES
from hf_posenc.adapters.base import ADAPTERS

CATALOG = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "zoo_catalog.json").read_text())
SLOW_CELL_S = 1.0  # cells that took longer than this when the catalog was written run only under -m slow


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared machine the spinning threads
    cost 20x (a 0.09 s cell took 2.1 s with two threads under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sampled(model_type: str, names: list[str]) -> set[str]:
    """The fast run's cells of one type: those of no site (`native`, the scaling against transformers')
    and, per site, one of its rows (patch/unpatch, cache, left padding) in rotation over the types."""
    by_site: dict[str, list[str]] = {}
    for name in names:
        row, _, site = name.partition("-")
        by_site.setdefault(site, []).append(name)
    keep = set(by_site.pop("", []))
    for site, rows in by_site.items():
        keep.add(rows[zlib.crc32(f"{model_type}-{site}".encode()) % len(rows)])
    return keep


def _cell_params() -> list:
    """Every cell of every type; outside the sample (or slower than SLOW_CELL_S) only under -m slow."""
    params = []
    for model_type, row in sorted(CATALOG.items()):
        names = sorted(row.get("cells", {}))
        sample = _sampled(model_type, names)
        for name in names:
            outcome, seconds = row["cells"][name]["outcome"], row["cells"][name]["seconds"]
            marks = []
            if name not in sample or seconds > SLOW_CELL_S:
                marks.append(pytest.mark.slow)
            if outcome.startswith("n/a"):
                marks.append(pytest.mark.skip(reason=outcome))
            elif outcome.startswith("fail"):
                marks.append(pytest.mark.xfail(reason=outcome, strict=True))
            params.append(pytest.param(model_type, name, marks=marks, id=f"{model_type}-{name}"))
    return params


def test_catalog_covers_every_causal_lm_type():
    assert sorted(CATALOG) == sorted(zoo.model_types())


@pytest.mark.parametrize("model_type", sorted(CATALOG))
def test_build_and_adapter_verdict_match_the_catalog(model_type):
    """The type builds (or not) as recorded, and its adapter takes exactly the recorded schemes, or
    refuses the model with the recorded reason."""
    entry, model = zoo.cached(model_type)
    row = CATALOG[model_type]
    assert (entry.built, entry.forward) == (row["builds"], row["forward"]), entry.error
    if not entry.forward:
        assert entry.error.split(":")[0] == row["error"].split(":")[0]
        return
    verdict = zoo.verdict(model)
    assert verdict == {k: row.get(k) for k in verdict}


@pytest.mark.parametrize("model_type,cell", _cell_params())
def test_zoo_cell(model_type, cell):
    """One cell; the catalog run checked that the stock model passes the same cache/padding check."""
    _, model = zoo.cached(model_type)
    zoo.cells(model, baseline=False)[cell](model_type)


HAND_WRITTEN = ["gpt2", "llama", "mistral", "qwen2", "qwen3"]


def read(adapter, dotted):
    """A field of an adapter's record by its dotted name (None where the record is)."""
    record, _, name = dotted.rpartition(".")
    value = getattr(adapter, record) if record else adapter
    return getattr(value, name, None) if value is not None else None


@pytest.mark.parametrize("model_type", HAND_WRITTEN + ["bert", "roberta"])
def test_generic_discovery_agrees_with_the_hand_written_adapter(model_type):
    """Reading the instance finds what the hand-written adapters state (the encoders as MLMs)."""
    model = zoo.build(model_type) if model_type in HAND_WRITTEN else tiny_model(model_type)
    ours, theirs = adapter_from(discover(model)), ADAPTERS[model_type]
    fields = ("native", "causal", "blocks.loop", "blocks.layers", "blocks.attention", "slot.path", "slot.hooked",
              "slot.adds_offset", "rotation.module", "embeddings.token_type_ids", "embeddings.other")
    assert {f: read(ours, f) for f in fields} == {f: read(theirs, f) for f in fields}
    assert ours.ids_offset(model.config) == theirs.ids_offset(model.config)
    assert (ours.slot and ours.slot.offset(model.config)) == (theirs.slot and theirs.slot.offset(model.config))
    assert (ours.qk.projections, ours.qk.packed, ours.qk.per_head) == \
        (theirs.qk.projections, theirs.qk.packed, theirs.qk.per_head)
    assert not ours.gaps


@pytest.mark.parametrize("model_type", ["opt", "bloom", "jamba", "gemma2", "deepseek_v3", "xlm"])
def test_discovery_finds_the_generic_adapters_records_and_the_catalog_prints_them(model_type):
    """`discover` returns the records the generic adapter holds (composed, not copied: the same objects) and the
    details the zoo catalog prints, which are still what discovery finds."""
    _, model = zoo.cached(model_type)
    found = discover(model)
    assert json.loads(json.dumps(found.to_dict(), default=str)) == CATALOG[model_type]["structure"]
    try:
        adapter = adapter_from(found)
    except hp.PosEncError as exc:
        assert found.blocks is None and CATALOG[model_type]["refused"] == str(exc)  # xlm: its attention is a list
        return
    records = ("blocks", "slot", "embeddings", "rotation", "qk", "bias")
    assert all(getattr(adapter, r) is getattr(found, r) for r in records)
    assert (adapter.native, adapter.causal, adapter.model_types) == (found.native, found.causal, (model_type,))


@pytest.mark.parametrize("model_type", ["gemma2", "phi", "opt", "zamba", "deepseek_v3"])
def test_a_config_alone_gets_the_same_answer_as_the_instance(model_type):
    """hp.supports(config) reads a meta-device model built from the config."""
    _, model = zoo.cached(model_type)
    config = zoo.tiny_config(model_type)
    for scheme in hp.list_schemes():
        assert hp.supports(config, scheme) == hp.supports(model, scheme), scheme


@pytest.mark.parametrize("model_type,missing", [
    ("ctrl", "buffer pos_encoding"),  # a sinusoidal table added inside forward, no module to swap
    ("inkling2_text", "relative_position_bias"),  # a learned relative bias module in each attention
    ("prophetnet", "relative_pos_embeddings"),
    ("mamba", "no num_attention_heads"),
])
def test_models_whose_positions_cannot_be_placed_are_refused_by_name(model_type, missing):
    _, model = zoo.cached(model_type)
    with pytest.raises(hp.PosEncError, match=missing):
        hp.patch(model, "alibi")


@pytest.mark.parametrize("model_type,scheme,options,reason", [
    ("bloom", "xpos", {}, "BloomAttention does not call attention through"),  # xPos computes the logits itself
    ("lfm3", "nope", {}, "reads `rotary_emb.layer_types`"),  # data: quirks.KNOWN_GAPS
    ("laguna", "alibi", {}, "num_attention_heads_per_layer"),
    ("roformer", "learned", {}, "not a code added to the token embeddings"),  # its table feeds a rotation
    # transformers 5.24's model-level rotary tables build without reading rope_parameters: a rebuild would
    # silently keep the stock rotation
    ("gptj", "yarn", {"factor": 2.0}, "GPTJRotaryEmbedding(config) ignores rope_parameters"),
    ("codegen", "rope", {"theta": 100.0}, "CodeGenRotaryEmbedding(config) ignores rope_parameters"),
])
def test_unsupported_cells_say_why_and_refuse_cleanly(model_type, scheme, options, reason):
    model = zoo.build(model_type)
    before = zoo.logits(model, zoo.inputs())
    assert reason in hp.catalog.why_not(model, scheme)
    with pytest.raises(hp.PosEncError, match="cannot take scheme"):
        hp.patch(model, scheme, **options)
    assert hp.describe(model) is None
    assert torch.equal(zoo.logits(model, zoo.inputs()), before)


def test_per_layer_type_rotation_keeps_each_types_theta():
    """Gemma 3 rotates sliding layers with theta 10k and full layers with 1M: `yarn` scales both, each
    keeping its own theta unless `theta` is given; NoPE layer types (BEAM's full layers) stay unrotated."""
    model = hp.patch(zoo.build("gemma3_text"), "yarn", factor=2.0)
    params = model.config.rope_parameters
    assert {k: (v["rope_type"], v["rope_theta"]) for k, v in params.items()} == {
        "full_attention": ("yarn", 1e6), "sliding_attention": ("yarn", 1e4)}
    hp.patch(model, "yarn", factor=2.0, theta=5e5)
    assert {v["rope_theta"] for v in model.config.rope_parameters.values()} == {5e5}
    assert hp.patch(zoo.build("beam"), "yarn", factor=2.0).config.rope_parameters["full_attention"] is None


def test_blocks_that_drop_kwargs_get_them_relayed():
    """StableLM's decoder layer takes **kwargs but calls attention without them: a block pre-hook hands
    the bias and positions over (alibi differs from nope), and unpatch leaves no hook behind."""
    model, x = zoo.build("stablelm"), zoo.inputs()
    before = zoo.logits(model, x)
    assert hp.catalog.adapter_for(model).blocks.relay_kwargs
    alibi = zoo.logits(hp.patch(model, "alibi"), x)
    assert not torch.allclose(alibi, zoo.logits(hp.patch(model, "nope"), x), atol=1e-3)
    hp.unpatch(model)
    assert not any(m._forward_pre_hooks for m in model.modules())
    assert torch.equal(zoo.logits(model, x), before)


@pytest.mark.parametrize("scheme,options", [("learned", {"max_positions": 256, "init": "interpolate"}),
                                            ("sinusoidal", {}), ("alibi", {})])
def test_a_slot_called_with_its_own_arguments_takes_the_loops_positions(scheme, options, tmp_path):
    """OPT's decoder (the layer loop, below base_model) calls its table as (mask, past length, position_ids=)
    and adds the offset 2 itself: position ids count from 0, explicit ones are honoured, and a saved patch
    reloads with a table plain transformers sizes from max_position_embeddings."""
    model, x = zoo.build("opt"), zoo.inputs()
    adapter = hp.catalog.adapter_for(model)
    assert (adapter.blocks.loop, adapter.slot.hooked, adapter.ids_offset(model.config)) == ("decoder", True, 0)
    patched = zoo.logits(hp.patch(model, scheme, **options), x)
    positions = torch.arange(x.shape[1])[None]
    torch.testing.assert_close(zoo.logits(model, x, position_ids=positions), patched)
    shifted = zoo.logits(model, x, position_ids=positions + 3)
    assert torch.allclose(shifted, patched, atol=1e-4) == (scheme == "alibi")  # only absolute codes see a shift
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(zoo.logits(hp.from_pretrained(str(tmp_path)).eval(), x), patched)
    hp.unpatch(model)
    assert not any(m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("scheme,options", [("learned", {"init": "normal"}), ("alibi", {})])
def test_generate_through_a_hooked_slot_follows_padding_and_static_caches(scheme, options):
    """OPT's slot gets the loop's positions on every decoding step: a left-padded row generates what the
    prompt alone does, with a dynamic or a static cache."""
    model, x = hp.patch(zoo.build("opt"), scheme, **options), zoo.inputs(length=6)
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    dynamic = model.generate(x, attention_mask=mask, max_new_tokens=5, do_sample=False)
    static = model.generate(x, attention_mask=mask, max_new_tokens=5, do_sample=False, cache_implementation="static")
    assert torch.equal(dynamic, static)
    assert torch.equal(dynamic[0, 2:], model.generate(x[:1, 2:], max_new_tokens=5, do_sample=False)[0])


def test_hybrid_models_tap_only_their_attention_layers():
    """Jamba's mamba blocks have no attention: q/k taps go on the attention blocks alone."""
    model = zoo.build("jamba")
    adapter = hp.catalog.adapter_for(model)
    blocks = list(model.base_model.get_submodule(adapter.blocks.layers))
    assert adapter.blocks.attention_layers == tuple(i for i, b in enumerate(blocks) if hasattr(b, "self_attn"))
    assert 0 < len(adapter.attention_modules(model)) < len(blocks)


def test_a_patched_copy_gets_the_adapter_of_the_stock_model():
    """Discovery never reads the modules a patch installed: a deepcopy (TRL reference models, EMA)
    of a patched model is read as its stock structure."""
    model = hp.patch(zoo.build("mixtral"), "learned", init="normal")
    stock = hp.catalog.adapter_for(zoo.build("mixtral"))
    assert hp.catalog.adapter_for(copy.deepcopy(model)) == stock


def test_support_table_list_and_readme_are_the_catalog():
    """benchmarks/results/zoo_support.md, what `hf-posenc list` ships and the support page's summary are
    generated from the catalog, which the tests above keep equal to what the code does."""
    root = Path(__file__).parents[1]
    assert (root / "benchmarks" / "results" / "zoo_support.md").read_text() == zoo.table(CATALOG)
    shipped = json.loads(MODEL_TYPES.read_text())
    assert shipped == {**zoo.shipped(CATALOG), "transformers": shipped["transformers"]}
    assert shipped["transformers"] == transformers.__version__, "catalog written on another transformers"
    assert zoo.readme_block(CATALOG) in (root / "docs" / "support.md").read_text(), "rerun benchmarks/zoo_catalog.py"


# ---------------------------------------------------------------- real configs (tests/real_configs.py)

REAL_SCHEMES = [("rope", {}), ("linear", {"factor": 2.0}), ("ntk", {"factor": 2.0}), ("dynamic", {"factor": 2.0}),
                ("yarn", {"factor": 2.0}), ("llama3", {"factor": 2.0}), ("longrope", {"factor": 2.0}),
                ("alibi", {}), ("nope", {})]
_REAL_MODELS: dict[str, torch.nn.Module] = {}


def _real(name: str) -> torch.nn.Module:
    if name not in _REAL_MODELS:
        _REAL_MODELS[name] = real_configs.build(name)
    return _REAL_MODELS[name]


@pytest.mark.parametrize("scheme,options", REAL_SCHEMES, ids=[s for s, _ in REAL_SCHEMES])
@pytest.mark.parametrize("name", sorted(real_configs.REAL_CONFIGS))
def test_real_configs_take_every_rope_scheme(name, scheme, options):
    """Built from the keys a Hub config.json has (no head_dim, rope_scaling of type llama3/yarn/longrope,
    partial_rotary_factor, sliding windows, MoE fields): the scheme patches, runs and unpatches exactly."""
    model = _real(name)
    x = zoo.inputs()
    stock = zoo.logits(model, x)
    assert hp.supports(model, scheme), hp.catalog.why_not(model, scheme)
    hp.patch(model, scheme, **options)
    try:
        patched = zoo.logits(model, x)
        assert patched.shape == stock.shape and torch.isfinite(patched).all()
        if scheme in ("alibi", "nope"):
            assert not torch.allclose(patched, stock, atol=1e-3), "the scheme changed nothing"
    finally:
        hp.unpatch(model)
    assert torch.equal(zoo.logits(model, x), stock)


def test_mixtral_without_head_dim_takes_yarn():
    """The finding: Mixtral-8x7B's config.json names no head_dim, and one failing YaRN probe refused every
    RoPE scheme. Now each RoPE type is probed on its own, on a config copy with head_dim filled in."""
    data = real_configs.REAL_CONFIGS["mistralai/Mixtral-8x7B-v0.1"]
    assert "head_dim" not in data
    model = _real("mistralai/Mixtral-8x7B-v0.1")
    assert getattr(model.config, "head_dim", None) is None
    x = zoo.inputs()
    stock = zoo.logits(model, x)
    hp.patch(model, "yarn", factor=2)
    assert hp.describe(model).options["factor"] == 2
    assert (zoo.logits(model, x) - stock).abs().max() > 1e-3
    hp.unpatch(model)
    assert getattr(model.config, "head_dim", None) is None  # the model's own config is left as the file had it
    assert not hp.adapters.generic.generic_adapter(model).gaps
