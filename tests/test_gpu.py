"""The GPU paths (issue 32), run by `make test-gpu`: the invariant rows on CUDA against CPU, the fast-attention
backends (flash-attn, FlexAttention, chunked) against the reference on CUDA, forward and backward, a recipe
step in bf16 with distillation and PoSE, and FSDP2 where there are several GPUs. Each CUDA test is skipped by
name without a GPU; what runs writes its numbers to out/test-gpu/results.json."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import hf_posenc as hp
from conftest import TINY_CONFIGS
from hf_posenc import results
from hf_posenc.fast_attention import backends, biased_attention, choose_backend
from hf_posenc.fast_attention.terms import Call
from matrix import SCHEMES, patched, scheme_of
from test_fast_attention import LEARNED, inputs, left_padded, make_bias, make_case, reference
from test_train import REPO, recipe_dict, tiny_assets, write_recipe

pytestmark = pytest.mark.xdist_group("gpu")  # one worker builds the module fixture

RESULTS = REPO / "out" / "test-gpu" / "results.json"
CUDA = torch.cuda.is_available()
LLAMA_LABELS = [label for label in SCHEMES if hp.supports(TINY_CONFIGS["llama"](), scheme_of(label))]
TERMS = ["alibi", "t5", "fire", "kerple", "untied", "self_extend"]


@pytest.fixture(scope="module")
def record() -> Any:
    """Numbers of the checks that ran, written to RESULTS when the module ends."""
    checks: dict[str, Any] = {}
    yield checks
    device = torch.cuda.get_device_name() if CUDA else "cpu"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    results.write_json(RESULTS, {"device": device, "gpus": torch.cuda.device_count(), "torch": torch.__version__,
                                 "checks": checks})


def max_gap(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.float().cpu() - expected.float().cpu()).abs().max().item()


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the invariant rows on a GPU")
@pytest.mark.parametrize("label", LLAMA_LABELS)
def test_patched_model_on_cuda_equals_cpu(label, record):
    """Logits of a left-padded batch and greedy generate (dynamic and static cache) on CUDA equal CPU's."""
    model = patched("llama", label)
    batch, mask = left_padded()
    greedy = dict(do_sample=False, max_new_tokens=4, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        expected = model(batch, attention_mask=mask).logits * mask[..., None]
        sequences = model.generate(batch, attention_mask=mask, **greedy)
        model.cuda()
        got = model(batch.cuda(), attention_mask=mask.cuda()).logits * mask.cuda()[..., None]
        for cache in ("dynamic", "static"):
            out = model.generate(batch.cuda(), attention_mask=mask.cuda(), cache_implementation=cache, **greedy)
            assert torch.equal(out.cpu(), sequences), cache
    record[f"cuda_vs_cpu/{label}"] = max_gap(got, expected)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


def on_cuda(term: str, case_name: str, backend: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One fast-attention call on CUDA, and the fp64 reference on CPU."""
    bias, case = make_bias(term), make_case(case_name)
    query, key, value = inputs(case)
    expected = reference(bias, case, query, key, value)
    padding, documents = case.spec.key_padding, case.spec.documents
    spec = dataclasses.replace(case.spec, key_padding=None if padding is None else padding.cuda(),
                               documents=None if documents is None else documents.cuda())
    got, _ = biased_attention(*(x.cuda().to(dtype) for x in (query, key, value)), q_pos=case.q_pos.cuda(),
                              k_pos=case.k_pos.cuda(), bias=None if bias is None else bias.cuda(), mask=spec,
                              backend=backend)
    return got, expected


@pytest.mark.skipif(not CUDA, reason="needs CUDA: flash-attn, FlexAttention and chunked kernels on a GPU")
@pytest.mark.parametrize("backend,term", [("flex", t) for t in TERMS] + [("chunked", t) for t in TERMS]
                         + [("flash_alibi", "alibi")])
def test_fast_attention_on_cuda_equals_the_reference(backend, term, record):
    if backend == "flash_alibi" and not backends.flash_runs(torch.device("cuda"), torch.bfloat16):
        pytest.skip("needs flash-attn that runs on this GPU")
    cases = ["causal", "window", "continue"] if backend == "flash_alibi" else ["causal", "window", "left_padding",
                                                                             "packed", "decode", "static_cache"]
    dtype = torch.bfloat16 if backend == "flash_alibi" else torch.float32
    gaps = {}
    with torch.no_grad():
        for name in cases:
            got, expected = on_cuda(term, name, backend, dtype)
            gaps[name] = max_gap(got, expected)
            torch.testing.assert_close(got.float().cpu(), expected, atol=6e-2 if dtype == torch.bfloat16 else 2e-4,
                                       rtol=0 if dtype == torch.bfloat16 else 1e-3, msg=lambda m, n=name: f"{n}: {m}")
    record[f"fast_attention/{backend}/{term}"] = gaps


@pytest.mark.skipif(not CUDA, reason="needs CUDA: FlexAttention's backward")
@pytest.mark.parametrize("term", LEARNED)
def test_auto_trains_every_learned_term_on_cuda(term, record):
    """loss.backward() through auto (flex where its backward lowers, chunked for FIRE) gives the dense gradients."""
    grads, routes = {}, {}
    for backend in ("dense", "auto"):
        bias, case = make_bias(term).cuda(), make_case("causal")
        tensors = [x.cuda().requires_grad_() for x in inputs(case)]
        call = Call(*tensors, case.q_pos.cuda(), case.k_pos.cuda(), bias, case.spec, 0.25, 0.0)
        routes[backend] = choose_backend(call) if backend == "auto" else "dense"
        out, _ = biased_attention(*tensors, q_pos=call.q_pos, k_pos=call.k_pos, bias=bias, mask=case.spec,
                                  backend=backend)
        (out * torch.linspace(-1, 1, out.shape[-1], device="cuda")).sum().backward()
        grads[backend] = [t.grad for t in tensors] + [p.grad for p in bias.parameters() if p.grad is not None]
    record[f"auto_backward/{term}"] = {"route": routes["auto"],
                                      "gap": max(max_gap(a, b) for a, b in zip(grads["auto"], grads["dense"]))}
    for got, expected in zip(grads["auto"], grads["dense"], strict=True):
        torch.testing.assert_close(got, expected, atol=max(1e-3, 1e-3 * expected.abs().max().item()), rtol=1e-3)


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    return tiny_assets(tmp_path_factory.mktemp("tiny"))


def test_recipe_step_in_bf16_with_distillation_and_pose(assets, tmp_path, record):
    """A recipe's steps as on a GPU run: bf16 autocast, lm+distill against the unpatched teacher, PoSE
    positions stretched 4x; on CUDA where there is one, else on the CPU."""
    from hf_posenc.train import load_recipe, train

    data = recipe_dict(assets, tmp_path / "out", pose={"target_length": 128, "chunks": 2}, max_steps=3,
                       bf16=True, objective="lm+distill")
    metrics = train(load_recipe(write_recipe(tmp_path / "r.yaml", data))).run("after training").metrics
    record["recipe_bf16_distill_pose"] = {"device": "cuda" if CUDA else "cpu", "after training": metrics}
    assert metrics["perplexity"] and all(math.isfinite(row["loss"]) for row in metrics["perplexity"].values())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs CUDA with 2+ GPUs: FSDP2")
def test_fsdp2_recipe_on_every_gpu(assets, tmp_path, record):
    config = yaml.safe_load((REPO / "hf_posenc" / "accelerate_configs" / "fsdp.yaml").read_text())
    config["num_processes"] = torch.cuda.device_count()
    (tmp_path / "fsdp.yaml").write_text(yaml.safe_dump(config))
    data = recipe_dict(assets, tmp_path / "out", max_steps=3, global_batch_size=2 * config["num_processes"],
                       per_device_train_batch_size=1, objective="lm+distill")
    recipe = write_recipe(tmp_path / "r.yaml", data)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "train", str(recipe), "--accelerate-config",
                           str(tmp_path / "fsdp.yaml")], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = results.load(tmp_path / "out" / "results.json").run("after training").metrics
    record["fsdp2"] = {"gpus": config["num_processes"], "after training": metrics}
    assert metrics["perplexity"] and all(math.isfinite(row["loss"]) for row in metrics["perplexity"].values())
