"""A mistake against the API never changes the model or the user's files (issue 18, API half).

Every case asserts the error type, that the message names the thing and what is allowed, and that the
model is bit-identical afterwards (state_dict keys and values, describe, logits) -- also when a previous
patch with trained weights (t5, fire, kerple, learned) was in place, whose modules must be the same
objects after the failed call, not rebuilt from their config. Folders are hashed before and after.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

import hf_posenc as hp
from conftest import tiny_model
from seq2seq_models import tiny_seq2seq
from hf_posenc.patching import describe_modules, validate
from hf_posenc.schemes.base import BiasScheme, ModelFacts, SCHEMES

# the mistakes matrix with the release self-check forced on: a check that cries wolf would change what it raises
pytestmark = pytest.mark.usefixtures("self_check_forced")

IDS = torch.tensor([[5, 17, 3, 99, 42, 8, 61, 23, 7, 88, 14, 30]])

# previous patches a failed call must leave in place: (model type, scheme, options); trained a step first
PREVIOUS = {
    "stock": ("llama", None, {}),
    "alibi": ("llama", "alibi", {}),
    "yarn": ("llama", "yarn", {"factor": 2.0}),
    "t5": ("llama", "t5", {"init_std": 0.3}),
    "fire": ("llama", "fire", {"init": "random"}),
    "kerple": ("llama", "kerple", {}),
    "learned": ("gpt2", "learned", {}),
    "t5-seq2seq": ("t5", "t5", {}),  # an encoder-decoder T5 (tests/seq2seq_models.py), both stacks
}
TRAINED = ("t5", "fire", "kerple", "learned")


def prepared(kind: str) -> nn.Module:
    """A tiny model with the `kind` patch; a patch with weights is trained one step, so a rollback that
    re-initialised it from its config would show."""
    model_type, scheme, options = PREVIOUS[kind]
    model = tiny_seq2seq(model_type) if model_type == "t5" else tiny_model(model_type)
    if scheme is None:
        return model
    hp.patch(model, scheme, **options)
    params = [p for m in describe_modules(model) for p in m.parameters()]
    if params:
        before = [p.detach().clone() for p in params]
        model(IDS, labels=IDS).loss.backward()
        with torch.no_grad():
            for p in params:
                p -= 0.5 * p.grad
                p.grad = None
        assert any(not torch.equal(a, p) for a, p in zip(before, params)), "the training step changed nothing"
    return model


@dataclass
class Snapshot:
    state: dict[str, torch.Tensor]
    described: Any
    logits: torch.Tensor
    modules: list[nn.Module]


def snapshot(model: nn.Module) -> Snapshot:
    decoder = {"decoder_input_ids": IDS[:, :6]} if model.config.is_encoder_decoder else {}
    with torch.no_grad():
        logits = model(IDS, **decoder).logits.clone()
    return Snapshot({k: v.detach().clone() for k, v in model.state_dict().items()}, hp.describe(model), logits,
                    describe_modules(model))


def assert_unchanged(model: nn.Module, before: Snapshot) -> None:
    after = snapshot(model)
    assert after.state.keys() == before.state.keys(), set(after.state) ^ set(before.state)
    changed = [k for k in after.state if not torch.equal(after.state[k], before.state[k])]
    assert not changed, changed
    assert after.described == before.described
    assert torch.equal(after.logits, before.logits)
    assert len(after.modules) == len(before.modules) and all(a is b for a, b in zip(after.modules, before.modules)), \
        "the previous patch's modules were rebuilt, not restored"


def refused(model: nn.Module, call: Any, *names: str, error: type = hp.PosEncError) -> str:
    """`call()` raises `error` whose message contains every one of `names`; the model is as it was."""
    before = snapshot(model)
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    for name in names:
        assert name in message, (name, message)
    assert_unchanged(model, before)
    return message


# ---------------------------------------------------------------- options, whatever was patched before

# (scheme, options, what the message must name: the option and what is allowed)
OPTION_MISTAKES = [
    ("yarn", {"factor": float("inf")}, ["factor", "a number >= 1"]),
    ("yarn", {"factor": 2.0, "beta_fast": -1.0}, ["beta_fast", "a number > 0"]),
    ("yarn", {"factor": 2.0, "beta_fast": 1.0, "beta_slow": 2.0}, ["beta_slow must be < beta_fast"]),
    ("llama3", {"factor": 2.0, "low_freq_factor": 0}, ["low_freq_factor", "a number > 0"]),
    ("alibi", {"scale": float("inf")}, ["scale", "a number > 0"]),
    ("kerple", {"r1": float("inf")}, ["r1", "a number > 0"]),
    ("rope", {"theta": float("nan")}, ["theta", "a number > 0"]),
    ("rope", {"partial": 1.5}, ["partial", "in (0, 1]"]),
    ("linear", {}, ["option 'factor' is required", "a number >= 1"]),
    ("t5", {"num_buckets": 3.5}, ["num_buckets", "an int >= 4"]),
    ("fire", {"init": "ones"}, ["init", "one of ('zeros', 'random')"]),
    ("learned", {"max_positions": 0}, ["max_positions", "an int >= 1"]),
    ("rope", {"factr": 2.0}, ["no option 'factr'", "it takes: theta, partial"]),
    ("rotary", {}, ["unknown scheme 'rotary'", "available schemes: alibi"]),
    ("longrope", {"factor": 2.0, "short_factor": "1,1"}, ["short_factor", "a list of numbers"]),
    ("self_extend", {"group": 0}, ["group", "an int >= 1"]),
]


@pytest.mark.parametrize("kind", ["stock", "alibi", "t5", "fire", "kerple"])
@pytest.mark.parametrize("scheme,options,names", OPTION_MISTAKES, ids=lambda v: str(v)[:30])
def test_a_bad_option_changes_nothing(kind, scheme, options, names):
    model = prepared(kind)
    refused(model, lambda: hp.patch(model, scheme, **options), *names)


# ---------------------------------------------------------------- options against the model's facts

FACT_MISTAKES = [
    ("concat", {"d_pos": 1000}, ["scheme 'concat'", "d_pos must be < the hidden size 64"]),
    ("concat", {"d_pos": 64}, ["d_pos must be < the hidden size 64"]),
    ("longrope", {"factor": 2.0, "short_factor": [1.0]}, ["short_factor must have 8 entries", "got 1"]),
    ("longrope", {"factor": 2.0, "long_factor": [2.0] * 9}, ["long_factor must have 8 entries"]),
    ("longrope", {"factor": 2.0, "partial": 0.5, "short_factor": [1.0] * 8}, ["short_factor must have 4 entries"]),
]


@pytest.mark.parametrize("kind", ["stock", "alibi", "yarn", "t5", "fire", "kerple"])
@pytest.mark.parametrize("scheme,options,names", FACT_MISTAKES, ids=lambda v: str(v)[:30])
def test_options_checked_against_the_model_before_the_first_change(kind, scheme, options, names):
    """The finding: `alibi`, then `concat d_pos=1000` left the stock model; on a trained t5, the rollback
    re-initialised the bias."""
    model = prepared(kind)
    refused(model, lambda: hp.patch(model, scheme, **options), *names)
    assert validate(tiny_model("llama").config, "rope").scheme == "rope"
    with pytest.raises(hp.PosEncError, match=names[0].replace("(", r"\(")):
        validate(model.config, scheme, **options)  # from the config alone, as the CLI checks before loading


@pytest.mark.parametrize("scheme,options,names", [
    ("concat", {"d_pos": 1000}, ["d_pos must be < the hidden size 64"]),
    ("yarn", {"factor": float("inf")}, ["factor"]),
    ("learned", {"init": "copy", "max_positions": -1}, ["max_positions", "an int >= 1"]),
])
def test_a_trained_learned_table_survives_a_failed_re_patch(scheme, options, names):
    model = prepared("learned")
    refused(model, lambda: hp.patch(model, scheme, **options), *names)


def test_a_scheme_the_model_cannot_take_is_refused_with_what_it_can():
    model = tiny_model("bert")
    refused(model, lambda: hp.patch(model, "xpos"), "'bert' models", "cannot take scheme 'xpos'", "supported: alibi")


# ---------------------------------------------------------------- an install failing halfway

class HalfwayBias(BiasScheme):
    """A user scheme whose module fails after the installer switched the model's own positions off and
    changed its attention implementation: what a rollback must undo."""

    name = "halfway_bias_test"
    Options = type("HalfwayOptions", (), {"__dataclass_fields__": {}})
    citation = "test"

    def module(self, options: dict[str, Any], facts: ModelFacts) -> nn.Module:
        raise RuntimeError("the scheme's module cannot be built")


@pytest.fixture
def halfway():
    from dataclasses import dataclass as dc

    HalfwayBias.Options = dc(frozen=True)(type("HalfwayOptions", (), {}))
    hp.register_scheme(HalfwayBias())
    yield HalfwayBias.name
    SCHEMES.pop(HalfwayBias.name)


@pytest.mark.parametrize("kind", list(PREVIOUS))
def test_an_install_failing_halfway_restores_the_same_objects(kind, halfway):
    model = prepared(kind)
    attn = model.config._attn_implementation
    hooks = {name: list(m._forward_pre_hooks.values()) for name, m in model.named_modules()}
    refused(model, lambda: hp.patch(model, halfway), "the scheme's module cannot be built", error=RuntimeError)
    assert model.config._attn_implementation == attn
    after = {name: list(m._forward_pre_hooks.values()) for name, m in model.named_modules()}
    assert after.keys() == hooks.keys()
    assert all(len(after[k]) == len(v) and all(a is b for a, b in zip(after[k], v)) for k, v in hooks.items()), \
        "hooks were rebuilt or reordered"


def test_a_restored_patch_still_unpatches_to_the_stock_model(halfway):
    model = tiny_model("llama")
    stock = snapshot(model)
    hp.patch(model, "t5", init_std=0.3)
    with pytest.raises(RuntimeError):
        hp.patch(model, halfway)
    hp.unpatch(model)
    assert_unchanged(model, stock)


# ---------------------------------------------------------------- encoder-decoder models (issue 19)
# (an install failing halfway on a trained T5: test_an_install_failing_halfway_restores_the_same_objects)

@pytest.mark.parametrize("scheme,options,names", [
    ("t5", {"max_distance": 3}, ["max_distance must be an int > num_buckets/2 = 4", "got 3"]),  # the model's 8
    ("t5", {"init": "copy", "num_buckets": 16}, ["init='copy' needs the model's own bucket table of shape (16, 4)"]),
    ("concat", {"d_pos": 1000}, ["d_pos must be < the hidden size 64"]),
    ("sinusoidal", {"layout": "stacked"}, ["layout must be one of ('interleaved', 'halves', 'fairseq')"]),
    ("sinusoidal", {"origin": -1}, ["origin must be an int >= 0"]),
    ("rope", {"stacks": ("encoder", "cross")}, ["stacks must be a non-empty list of 'encoder', 'decoder'"]),
    ("rope", {"stacks": {"encoder"}}, ["stacks must be a non-empty list", "got {'encoder'}"]),
])
def test_a_failed_re_patch_of_a_trained_t5_changes_nothing(scheme, options, names):
    model = prepared("t5-seq2seq")  # its own bucket tables, one per stack, taken over by `t5` and trained
    refused(model, lambda: hp.patch(model, scheme, **options), *names)
    with pytest.raises(hp.PosEncError):
        validate(model, scheme, **options)


def test_stacks_is_checked_and_round_trips():
    assert hp.PosEncConfig.from_dict(hp.PosEncConfig("alibi", stacks="decoder").to_dict()).stacks == ("decoder",)
    with pytest.raises(hp.PosEncError, match=r"config.posenc: stacks must be a non-empty list.*got 'both'"):
        hp.PosEncConfig.from_dict({"scheme": "alibi", "options": {}, "stacks": "both"})
    model = tiny_model("llama")
    refused(model, lambda: hp.patch(model, "alibi", stacks=("decoder",)), "applies to encoder-decoder models",
            "'llama' has one attention stack")
    with pytest.raises(hp.PosEncError, match="applies to encoder-decoder models"):
        validate(model.config, "alibi", stacks=("decoder",))


# ---------------------------------------------------------------- PosEncConfig

@pytest.mark.parametrize("scheme,names", [
    (["rope"], ["scheme must be a scheme name (a string), got list", "available schemes: alibi"]),
    (3, ["got int 3"]),
    (None, ["got NoneType None"]),
    ({"rope": 1}, ["got dict"]),
    (b"rope", ["got bytes"]),
    ("", ["unknown scheme ''", "available schemes"]),
    ("ROPE", ["unknown scheme 'ROPE'"]),
])
def test_a_scheme_that_is_not_a_name(scheme, names):
    with pytest.raises(hp.PosEncError) as caught:
        hp.PosEncConfig(scheme)
    assert all(n in str(caught.value) for n in names), str(caught.value)


@pytest.mark.parametrize("data,names", [
    (None, ["config.posenc is not a hf-posenc config", "expected a dict with 'format', 'scheme', 'options'"]),
    ([], ["is not a hf-posenc config"]),
    ({"options": {}}, ["is not a hf-posenc config"]),
    ({"scheme": "rope", "options": None}, ["config.posenc.options must be a dict", "got None"]),
    ({"scheme": "rope", "options": [1]}, ["config.posenc.options must be a dict", "got [1]"]),
    ({"scheme": "rope", "options": "theta=1"}, ["options must be a dict"]),
    ({"format": 3, "scheme": "rope", "options": {}}, ["format 3", "reads format <= 2", "pip install -U hf-posenc"]),
    ({"format": "1", "scheme": "rope"}, ["format '1'"]),
    ({"format": True, "scheme": "rope"}, ["format True"]),
    ({"scheme": "nosuch", "options": {}}, ["config.posenc: unknown scheme 'nosuch'", "available schemes"]),
    ({"scheme": "rope", "options": {"theta": "x"}}, ["config.posenc: scheme 'rope': theta must be a number > 0"]),
    ({"scheme": ["rope"], "options": {}}, ["scheme must be a scheme name"]),
])
def test_a_damaged_config_posenc(data, names):
    with pytest.raises(hp.PosEncError) as caught:
        hp.PosEncConfig.from_dict(data)
    assert all(n in str(caught.value) for n in names), str(caught.value)


def test_replace_checks_the_new_options():
    config = hp.PosEncConfig("rope", theta=1e4)
    with pytest.raises(hp.PosEncError, match="theta must be a number > 0"):
        config.replace(theta=-1)
    assert config.options["theta"] == 1e4


# ---------------------------------------------------------------- models hf-posenc does not patch

def _vit() -> nn.Module:
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                    image_size=16, patch_size=8)
    return transformers.ViTModel(config).eval()


@pytest.mark.parametrize("call", ["patch", "validate", "supported", "config"])
def test_a_vision_model_is_refused_by_name(call):
    model = _vit()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if call == "supported":
        assert hp.supports(model, "rope") is False
        return
    target = model.config if call == "config" else model
    run = hp.patch if call == "patch" else validate
    with pytest.raises(hp.PosEncError) as caught:
        run(target, "rope")
    assert "'vit' is not a text model" in str(caught.value) and "hf-posenc list --model-types" in str(caught.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items()) and hp.describe(model) is None


# ---------------------------------------------------------------- positions

def test_whole_float_position_ids_on_a_table_are_taken_like_stock():
    """Stock Llama takes float position_ids; its learned patch now does too (and gives the integer answer)."""
    model = tiny_model("llama")
    hp.patch(model, "learned", init="normal")
    positions = torch.arange(IDS.shape[1])[None]
    with torch.no_grad():
        assert torch.equal(model(IDS, position_ids=positions.float()).logits, model(IDS, position_ids=positions).logits)
    before = snapshot(model)
    refused(model, lambda: model(IDS, position_ids=positions.float() + 0.5), "'learned' table takes whole-number")
    assert_unchanged(model, before)


# ---------------------------------------------------------------- saved folders

def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A folder saved after patching t5 and training it a step."""
    folder = tmp_path_factory.mktemp("saved") / "t5"
    prepared("t5").save_pretrained(folder)
    return folder


def _edit_posenc(folder: Path, change: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config["posenc"]) if callable(change) else config.__setitem__("posenc", change)
    (folder / "config.json").write_text(json.dumps(config))


def _set(key: str, value: Any) -> Any:
    return lambda posenc: posenc.__setitem__(key, value)


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _drop_patch_weights(folder: Path) -> None:
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "posenc" not in k and "relative" not in k and "t5" not in k},
              folder / "model.safetensors", metadata={"format": "pt"})


FOLDER_MISTAKES = {
    "truncated weights": (_truncate, ["model.safetensors", "cannot read the weights", "damaged or incomplete"]),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), ["cannot load the weights of", "give a saved model folder"]),
    "no config.json": (lambda f: (f / "config.json").unlink(), ["cannot load the config of", "config.json"]),
    "options null": (lambda f: _edit_posenc(f, _set("options", None)), ["config.json's posenc.options must be a dict",
                                                                         "got None"]),
    "options a list": (lambda f: _edit_posenc(f, _set("options", [32])), ["posenc.options must be a dict"]),
    "unknown scheme": (lambda f: _edit_posenc(f, _set("scheme", "t6")), ["posenc: unknown scheme 't6'",
                                                                         "available schemes"]),
    "future format": (lambda f: _edit_posenc(f, _set("format", 7)), ["format 7", "reads format <= 2"]),
    "option out of domain": (lambda f: _edit_posenc(f, _set("options", {"num_buckets": 2})),
                             ["posenc: scheme 't5': num_buckets must be an int >= 4"]),
    "unknown option": (lambda f: _edit_posenc(f, _set("options", {"buckets": 32})),
                       ["scheme 't5' has no option 'buckets'", "it takes: num_buckets"]),
    "patch weights missing": (_drop_patch_weights, ["lacks the weights of its 't5' patch"]),
}


@pytest.mark.parametrize("mistake", list(FOLDER_MISTAKES))
def test_a_damaged_saved_folder_is_refused_by_name_and_left_alone(saved, tmp_path, mistake):
    damage, names = FOLDER_MISTAKES[mistake]
    folder = tmp_path / "copy"
    folder.mkdir()
    for file in saved.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    assert isinstance(hp.from_pretrained(str(folder)), nn.Module)  # the undamaged copy loads
    damage(folder)
    digest = _digest(folder)
    with pytest.raises(hp.PosEncError) as caught:
        hp.from_pretrained(str(folder))
    message = str(caught.value)
    assert all(n in message for n in names), message
    assert str(folder) in message or "model.safetensors" in message, message
    assert _digest(folder) == digest


@pytest.mark.parametrize("model_cls,names", [
    ("AutoModelForCausalLM", ["model_cls takes a transformers Auto class or model class", "not a string"]),
    (42, ["model_cls takes", "got 42"]),
    (torch.nn.Linear, ["model_cls takes"]),
])
def test_model_cls_must_be_a_class(saved, model_cls, names):
    digest = _digest(saved)
    with pytest.raises(hp.PosEncError) as caught:
        hp.from_pretrained(str(saved), model_cls=model_cls)
    assert all(n in str(caught.value) for n in names), str(caught.value)
    assert _digest(saved) == digest


def test_a_saved_trained_patch_loads_back_exactly(saved):
    """The folder the mistakes above damage copies of is itself good: its trained bias comes back."""
    model = hp.from_pretrained(str(saved))
    weights = load_file(saved / "model.safetensors")
    names = {id(m): n for n, m in model.named_modules()}
    module = describe_modules(model)[0]
    for key, tensor in module.state_dict().items():
        assert torch.equal(tensor, weights[f"{names[id(module)]}.{key}"])


def test_the_cli_refuses_options_against_the_model_from_config_json_alone(saved, tmp_path, loads, capsys):
    """`check_model_takes` runs `validate` on config.json: the refusal comes before any weights load
    (transformers' own from_pretrained counted; the real call still runs)."""
    from hf_posenc import cli

    digest = _digest(saved)
    out = tmp_path / "out"
    code = cli.main(["patch", str(saved), "concat", "--opt", "d_pos=1000", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "scheme 'concat': d_pos must be < the hidden size 64, got 1000" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists() and _digest(saved) == digest
    assert loads == []
