"""Every folder hf-posenc writes loads back as what it is, through plain transformers Auto classes.

For each saved folder: `AutoModel*.from_pretrained(D, trust_remote_code=True)` gives the patched
logits exactly; without `trust_remote_code` a scheme transformers can express (RoPE scalings on a
rotating model) loads natively with the same logits, and every other scheme is refused with a message
saying how to load it -- never the stock model. `hp.from_pretrained` reads all of them, and folders
written before the marks existed."""

from __future__ import annotations

import copy
import os
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import tiny_model

import hf_posenc as hp
from hf_posenc import hub, loading, writing
from hf_posenc.patching import describe_modules

LONG = 100  # past the tiny models' 64-row tables, so a dropped patch cannot go unnoticed

# (model type, head, Auto class, scheme, options, native: plain transformers rebuilds it)
CELLS = [
    ("llama", "causal", "AutoModelForCausalLM", "yarn", {"factor": 4.0}, True),
    ("llama", "causal", "AutoModelForCausalLM", "rope", {"theta": 500.0}, True),
    ("llama", "causal", "AutoModelForCausalLM", "yarn", {"factor": 2.0, "partial": 0.5}, False),
    ("llama", "causal", "AutoModelForCausalLM", "alibi", {}, False),
    ("llama", "causal", "AutoModelForCausalLM", "kerple", {}, False),
    ("llama", "causal", "AutoModelForCausalLM", "nope", {}, False),
    ("qwen3", "causal", "AutoModelForCausalLM", "xpos", {}, False),
    ("gpt2", "causal", "AutoModelForCausalLM", "rope", {}, False),
    ("gpt2", "causal", "AutoModelForCausalLM", "learned", {"init": "interpolate", "max_positions": 128}, False),
    ("bert", "base", "AutoModel", "rope", {}, False),
    ("bert", "cls", "AutoModelForSequenceClassification", "sinusoidal", {}, False),
]


def output(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def patched(model_type: str, head: str, scheme: str, options: dict) -> torch.nn.Module:
    """A patched tiny model whose new weights (if any) are not their initial values, so a reload
    that re-initialises them instead of loading them shows."""
    model = hp.patch(tiny_model(model_type, head=head), scheme, **options)
    with torch.no_grad():
        for module in describe_modules(model):
            for param in module.parameters():
                param.add_(0.3 * torch.randn_like(param))
    return model


def refused_without_remote_code(load) -> None:
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        load()


@pytest.mark.parametrize("model_type, head, auto_class, scheme, options, native", CELLS,
                         ids=[f"{c[0]}-{c[3]}-{'-'.join(map(str, c[4].values()))}" for c in CELLS])
def test_a_saved_patched_model_loads_patched_or_not_at_all(tmp_path, model_type, head, auto_class, scheme, options,
                                                           native):
    auto = getattr(transformers, auto_class)
    model = patched(model_type, head, scheme, options)
    ids = torch.randint(1, 128, (2, LONG))
    expected = output(model, ids)
    folder = tmp_path / "model"
    model.save_pretrained(folder)

    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"][auto_class] == f"modeling_posenc.{writing.REMOTE_CLASSES[auto_class]}"
    assert (folder / writing.REMOTE_CODE).read_text() == writing.remote_code()
    assert config["model_type"] == (model_type if native else writing.MODEL_TYPE)
    assert ("AutoConfig" in config["auto_map"]) is not native
    # engines dispatch on `architectures`: only a config-only patch may name the stock class
    stock = type(model).__name__
    assert config["architectures"] == [stock if native else f"PosEnc{stock}"]
    assert writing.stock_architectures(config) == [stock]

    remote = auto.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(remote) is type(model) and hp.describe(remote) == hp.describe(model)
    assert torch.equal(output(remote, ids), expected)
    assert torch.equal(output(hp.from_pretrained(str(folder), model_cls=auto).eval(), ids), expected)

    if native:  # plain transformers rebuilds the same model from config.rope_parameters
        plain = auto.from_pretrained(folder).eval()
        assert hp.describe(plain) is None and torch.equal(output(plain, ids), expected)
    else:
        refused_without_remote_code(lambda: auto.from_pretrained(folder))
        refused_without_remote_code(lambda: transformers.AutoConfig.from_pretrained(folder))
        served = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)  # what an engine reads
        assert type(served) is type(model.config) and served.posenc["scheme"] == scheme
        assert served.architectures == [f"PosEnc{stock}"]
    assert remote.config.architectures == [stock]  # the model built is the stock class, patched

    # what was loaded through the remote code saves a folder that loads the same way again
    remote.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["architectures"] == config["architectures"]
    again = auto.from_pretrained(tmp_path / "again", trust_remote_code=True).eval()
    assert torch.equal(output(again, ids), expected)


def test_the_save_hook_is_plain_data_and_goes_with_the_patch(tmp_path):
    model = patched("llama", "causal", "alibi", {})
    hook = vars(model)["save_pretrained"]
    assert hook.func is writing.save_pretrained and hook.args == (model,)
    assert pickle.loads(pickle.dumps(hook.func)) is writing.save_pretrained  # by reference, no closure
    twin = copy.deepcopy(model)
    assert vars(twin)["save_pretrained"].args[0] is twin  # the copy saves itself, not the original
    twin.save_pretrained(tmp_path / "twin")
    assert json.loads((tmp_path / "twin" / "config.json").read_text())["model_type"] == writing.MODEL_TYPE

    hp.unpatch(model)
    assert "save_pretrained" not in vars(model)
    model.save_pretrained(tmp_path / "stock")
    config = json.loads((tmp_path / "stock" / "config.json").read_text())
    assert config["model_type"] == "llama" and "auto_map" not in config and "posenc" not in config
    assert not (tmp_path / "stock" / writing.REMOTE_CODE).exists()

    hp.patch(model, "nope")
    with pytest.raises(hp.PosEncError, match="is a file"):
        model.save_pretrained(tmp_path / "stock" / "config.json")


@pytest.mark.parametrize("dtype, expected", [("auto", torch.bfloat16), (None, torch.bfloat16),
                                             (torch.float16, torch.float16), ("float32", torch.float32)])
def test_the_dtype_argument_loads_as_transformers_does(tmp_path, dtype, expected):
    """dtype="auto" (transformers 5's default, and what lm-eval passes) reads the saved dtype instead of
    reaching the config as a string; the patch's own weights take the model's dtype too."""
    patched("llama", "causal", "kerple", {}).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = hp.from_pretrained(tmp_path / "bf16", **({} if dtype is None else {"dtype": dtype}))
    assert hp.describe(model).scheme == "kerple"
    assert {p.dtype for p in model.parameters()} == {expected}


def test_folders_saved_before_the_marks_still_load_and_export_marked(tmp_path):
    ids = torch.randint(1, 128, (1, LONG))
    for scheme, options, native in (("yarn", {"factor": 4.0}, True), ("kerple", {}, False)):
        model = patched("llama", "causal", scheme, options)
        old = tmp_path / f"old-{scheme}"
        type(model).save_pretrained(model, old)  # what hf-posenc wrote before: stock model_type, no auto_map
        assert json.loads((old / "config.json").read_text())["model_type"] == "llama"
        expected = output(model, ids)
        assert torch.equal(output(hp.from_pretrained(str(old)).eval(), ids), expected)

        repo = hub.export(old, tmp_path / f"repo-{scheme}")
        exported = json.loads((repo / "config.json").read_text())
        assert exported["model_type"] == ("llama" if native else writing.MODEL_TYPE)
        assert exported["architectures"] == ["LlamaForCausalLM" if native else "PosEncLlamaForCausalLM"]
        remote = transformers.AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True).eval()
        assert torch.equal(output(remote, ids), expected)
        assert json.loads((old / "config.json").read_text())["model_type"] == "llama"  # the source is untouched


def test_folders_that_name_the_stock_architecture_with_own_model_type_still_load(tmp_path):
    """The layout of the release before hf-posenc named its own architectures: model_type "hf_posenc",
    `architectures` the stock class."""
    model = patched("llama", "causal", "kerple", {})
    ids = torch.randint(1, 128, (1, LONG))
    expected = output(model, ids)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = config["posenc"].pop("architectures")
    (folder / "config.json").write_text(json.dumps(config))

    remote = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert torch.equal(output(remote, ids), expected)
    saved = loading.load_model(str(folder), task="saved")
    assert type(saved) is transformers.LlamaForCausalLM and torch.equal(output(saved, ids), expected)
    repo = hub.export(folder, tmp_path / "repo")
    assert json.loads((repo / "config.json").read_text())["architectures"] == ["PosEncLlamaForCausalLM"]


HIDE_HF_POSENC = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "hf_posenc":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
import transformers
transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
"""


def test_without_hf_posenc_installed_the_remote_code_names_the_package(tmp_path):
    patched("llama", "causal", "alibi", {}).save_pretrained(tmp_path / "model")
    proc = subprocess.run([sys.executable, "-c", HIDE_HF_POSENC, str(tmp_path / "model")], capture_output=True,
                          text=True, env={**__import__("os").environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert proc.returncode != 0
    assert "requires the following packages that were not found in your environment: hf_posenc" in proc.stderr


def test_auto_map_names_every_auto_class_that_builds_the_architecture():
    assert set(writing.auto_map("llama", config_only=True)) == {
        "AutoModel", "AutoModelForCausalLM", "AutoModelForQuestionAnswering", "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification"}
    kept = writing.auto_map("bert", config_only=False, old={"AutoTokenizer": "tok.T", "AutoModel": "modeling_posenc.Old"})
    assert kept["AutoTokenizer"] == "tok.T" and kept["AutoModel"] == "modeling_posenc.PosEncModel"
    assert kept["AutoModelForMaskedLM"] == "modeling_posenc.PosEncForMaskedLM"
    source = Path(writing.__file__).parent / "model_cards" / writing.REMOTE_CODE
    text = source.read_text()
    for auto_class, name in writing.REMOTE_CLASSES.items():
        assert f"class {name}(" in text and f'auto_class = "{auto_class}"' in text or name == "PosEncModel"


OLD_REMOTE_CODE = Path(writing.__file__).parent / "model_cards" / writing.LEGACY_REMOTE_CODE[0]


@pytest.mark.parametrize("scheme", ["alibi", "kerple"])
def test_a_folder_written_before_the_reader_moved_still_loads(tmp_path, scheme):
    """Folders saved before `loading` held every read carry a modeling_posenc.py that imports
    `from hf_posenc.saving import from_pretrained, load_config` (shipped as the file it was, for the self-check's load paths)."""
    assert "from hf_posenc.saving import from_pretrained, load_config" in OLD_REMOTE_CODE.read_text()
    model = patched("llama", "causal", scheme, {})
    ids = torch.randint(1, 128, (1, LONG))
    expected = output(model, ids)
    folder = tmp_path / f"written-before-loading-{scheme}"
    model.save_pretrained(folder)
    (folder / "modeling_posenc.py").write_text(OLD_REMOTE_CODE.read_text())
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    assert config.posenc["scheme"] == scheme
    remote = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert torch.equal(output(remote, ids), expected)
    assert torch.equal(output(hp.from_pretrained(str(folder)).eval(), ids), expected)


QUIET_TOKENIZER_LOADS = {
    "hf_posenc.load_tokenizer": "import hf_posenc; t = hf_posenc.load_tokenizer(FOLDER)",
    "AutoTokenizer with trust_remote_code": "import transformers; t = transformers.AutoTokenizer.from_pretrained("
                                            "FOLDER, trust_remote_code=True)",
    "AutoTokenizer with a bare config": "import transformers; t = transformers.AutoTokenizer.from_pretrained("
                                        "FOLDER, config=transformers.PretrainedConfig())",
    "the tokenizer class": "import transformers; t = transformers.PreTrainedTokenizerFast.from_pretrained(FOLDER)",
}


@pytest.fixture(scope="module")
def remote_code_folder(tmp_path_factory) -> Path:
    """A tiny llama patched with alibi (a folder that needs remote code) and a tokenizer of its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("alibi")
    hp.patch(tiny_model("llama"), "alibi").save_pretrained(folder)
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0").save_pretrained(folder)
    return folder


@pytest.mark.parametrize("route", sorted(QUIET_TOKENIZER_LOADS))
@pytest.mark.parametrize("terminal", [False, True], ids=["stdin-closed", "pty"])
def test_the_documented_tokenizer_loads_ask_nothing(remote_code_folder, route, terminal):
    """docs/guide/hub.md's quiet ways to the tokenizer of a folder that needs remote code: no question, no
    model-type warning, with stdin closed and in a pseudo-terminal (where a question would wait 15 s)."""
    code = QUIET_TOKENIZER_LOADS[route].replace("FOLDER", repr(str(remote_code_folder))) + "; print(t('w3 w5').input_ids)"
    command = [sys.executable, "-c", code]
    if terminal:
        import pty
        import time

        start = time.perf_counter()
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(sys.executable, command)
        output = b""
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
        status = os.waitpid(pid, 0)[1]
        text, seconds = output.decode(errors="replace"), time.perf_counter() - start
        assert os.waitstatus_to_exitcode(status) == 0, text
        # transformers' question (dynamic_module_utils) waits 15 s for an answer: its text, not the time, says it asked
        assert "Do you wish to run the custom code" not in text, f"{route} asked in a terminal ({seconds:.0f} s): {text}"
    else:
        proc = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout + proc.stderr
    assert "[3, 5]" in text
    assert "Do you wish to run the custom code" not in text and "You are using a model of type" not in text


NATIVE = [(arch, label) for arch in ("llama", "qwen3") for label in ("rope", "linear", "dynamic", "yarn", "llama3",
                                                                     "longrope")]


@pytest.mark.parametrize("arch, label", NATIVE, ids=[f"{a}-{lab}" for a, lab in NATIVE])
def test_unpatch_of_a_loaded_native_folder_gives_the_stock_model_back(tmp_path, arch, label):
    """A RoPE scaling saved as native rope_parameters: `hp.from_pretrained` builds the model as it was before the
    patch (config.posenc's config_before) and patches it, so `unpatch` gives the stock logits back bit for bit
    (it kept the scaled rotation, with describe() saying None); plain transformers still loads the scaling."""
    from matrix import SCHEMES, scheme_of

    from hf_posenc.config import BEFORE
    from hf_posenc.state import STATE_ATTR

    ids = torch.randint(3, 120, (2, LONG))
    model = tiny_model(arch)
    stock, stock_config = output(model, ids), model.config.to_dict()
    hp.patch(model, scheme_of(label), **SCHEMES[label])
    assert getattr(model, STATE_ATTR).config_only
    expected = output(model, ids)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["posenc"][BEFORE]["rope_parameters"] == stock_config["rope_parameters"]
    assert saved["rope_parameters"] != stock_config["rope_parameters"]  # what plain transformers reads
    assert torch.equal(output(transformers.AutoModelForCausalLM.from_pretrained(tmp_path), ids), expected)
    loaded = hp.from_pretrained(tmp_path)
    assert torch.equal(output(loaded, ids), expected)
    hp.unpatch(loaded)
    assert hp.describe(loaded) is None and torch.equal(output(loaded, ids), stock)
    fields = ("rope_parameters", "max_position_embeddings")
    assert {k: loaded.config.to_dict()[k] for k in fields} == {k: stock_config[k] for k in fields}


def test_a_native_folder_without_config_before_loads_as_before(tmp_path):
    """Folders written before config_before existed still load patched (unpatch then keeps their scaling: the
    stock fields are not in the folder); a config_before naming no field of the config is refused by name."""
    from hf_posenc.config import BEFORE

    ids = torch.randint(3, 120, (2, LONG))
    model = hp.patch(tiny_model("llama"), "yarn", factor=4.0)
    expected = output(model, ids)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["posenc"][BEFORE]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = hp.from_pretrained(tmp_path)
    assert torch.equal(output(loaded, ids), expected) and hp.describe(loaded) == hp.describe(model)
    for damaged in ([1, 2], {"no_such_field": 1}):
        config["posenc"][BEFORE] = damaged
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(hp.PosEncError, match=f"config.json's posenc.{BEFORE} maps the config's fields"):
            hp.from_pretrained(tmp_path)
