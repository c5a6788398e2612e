"""The `hf-posenc` entry point as a real process: list, patch, and errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

import hf_posenc as hp
from conftest import TINY, tiny_model


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", *args], capture_output=True, text=True, timeout=300)


def test_list_prints_the_registry_matrix():
    out = run("list", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["architectures"] == hp.list_architectures()
    assert data["matrix"]["bert"]["xpos"] is False and data["matrix"]["llama"]["yarn"] is True


@pytest.fixture
def tiny_folder(tmp_path):
    model = tiny_model("gpt2")
    vocab = {f"w{i}": i for i in range(TINY["vocab"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0")
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_patch_saves_a_model_that_reloads_patched(tiny_folder, tmp_path):
    out = run("patch", str(tiny_folder), "rope", "--opt", "theta=100", "--out", str(tmp_path / "rope"))
    assert out.returncode == 0, out.stderr
    assert "PosEncConfig(scheme='rope', theta=100.0, partial=1.0)" in out.stdout
    reloaded = hp.from_pretrained(str(tmp_path / "rope")).eval()
    expected = hp.patch(AutoModelForCausalLM.from_pretrained(tiny_folder).eval(), "rope", theta=100.0)
    ids = torch.randint(3, TINY["vocab"], (1, 12))
    assert torch.equal(reloaded(ids).logits, expected(ids).logits)
    assert AutoTokenizer.from_pretrained(tmp_path / "rope").pad_token == "w0"


@pytest.mark.parametrize("args,message", [
    (["rotary"], "unknown scheme 'rotary'; available schemes: alibi"),
    (["rope", "--opt", "theta=-1"], "theta must be > 0, got -1"),
    (["rope", "--opt", "theta"], "--opt takes key=value, got 'theta'"),
])
def test_patch_errors_exit_2_with_the_reason(tiny_folder, tmp_path, args, message):
    out = run("patch", str(tiny_folder), *args, "--out", str(tmp_path / "x"))
    assert out.returncode == 2
    assert message in out.stderr
    assert not (tmp_path / "x").exists()  # nothing written for a failed patch


@pytest.mark.parametrize("command", ["list", "patch", "demo", "eval", "inspect", "train", "card", "push"])
def test_every_subcommand_has_help_with_examples(command, capsys):
    from hf_posenc.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    assert "example" in capsys.readouterr().out.lower()
