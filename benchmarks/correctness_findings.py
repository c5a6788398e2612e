"""The seven silent-wrong-number findings of issue 9, measured on tiny peaky models.

Each finding is a maximum logit difference between two paths that must agree (0 up to float noise when
correct), or the failure seen. Tiny random models (hidden 64, 4 heads, 2 layers, initializer_range 0.2, so
attention is peaky and a wrong position shows as a large difference), fp32 unless stated.

Run it on any checkout (it only uses the public API, peft and torch):
    PYTHONPATH=<checkout> .venv/bin/python benchmarks/correctness_findings.py --label after
Results are merged into benchmarks/results/correctness_findings.json under the label.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_posenc as hp  # noqa: E402

OUT = Path(__file__).parent / "results" / "correctness_findings.json"
OPTIONS = {"t5": {"init_std": 0.5}, "kerple": {}, "fire": {"init": "random"}, "untied": {"init_std": 0.05},
           "self_extend": {"group": 2, "window": 4}, "alibi": {}, "rope": {"theta": 500.0},
           "xpos": {"scale_base": 16.0}, "learned": {}}


def tiny(arch: str = "llama", seed: int = 0, layers: int = 2, positions: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    if arch == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=layers, vocab_size=128, n_positions=positions,
                                         initializer_range=0.2, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    else:
        config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                          num_hidden_layers=layers, intermediate_size=128, vocab_size=128,
                                          max_position_embeddings=positions, initializer_range=0.2,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def patched(scheme: str, arch: str = "llama", **kw: Any) -> torch.nn.Module:
    return hp.patch(tiny(arch, **kw), scheme, **OPTIONS[scheme])


def ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def attempt(fn: Callable[[], Any]) -> Any:
    """The measurement, or the failure it ran into (type and message)."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - a failure is a finding here
        return f"FAILED: {type(err).__name__}: {str(err).splitlines()[0][:160]}"


@torch.no_grad()
def static_vs_dynamic(scheme: str) -> dict[str, float]:
    """Left-padded batch of two prompts, greedy `generate`: static cache vs dynamic cache vs each prompt alone."""
    model = patched(scheme)
    a, b = ids(1, 9, 1), ids(1, 6, 2)
    batch = torch.cat((a, torch.cat((torch.zeros(1, 3, dtype=torch.long), b), dim=1)))
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    kw = dict(max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0,
              eos_token_id=None)
    dynamic = model.generate(batch, attention_mask=mask, **kw)
    static = model.generate(batch, attention_mask=mask, cache_implementation="static", **kw)
    alone = model.generate(b, attention_mask=torch.ones_like(b), **kw)
    return {"static_vs_dynamic": max(diff(x, y) for x, y in zip(static.scores, dynamic.scores)),
            "padded_row_vs_alone": max(diff(x[1], y[0]) for x, y in zip(dynamic.scores, alone.scores))}


@torch.no_grad()
def packed_row(scheme: str) -> float:
    """Two documents in one row, position_ids restarting at 0: the second document vs the same alone."""
    model = patched(scheme)
    a, b = ids(1, 7, 3), ids(1, 6, 4)
    row = torch.cat((a, b), dim=1)
    positions = torch.cat((torch.arange(7), torch.arange(6)))[None]
    packed = model(row, position_ids=positions, use_cache=False).logits
    return max(diff(packed[:, 7:], model(b, use_cache=False).logits), diff(packed[:, :7], model(a, use_cache=False).logits))


@torch.no_grad()
def shifted(scheme: str) -> float:
    """All position_ids shifted by 8 (a multiple of Self-Extend's group) vs unshifted."""
    model = patched(scheme, arch="gpt2" if scheme == "rope" else "llama")
    x = ids(2, 12, 5)
    return diff(model(x, position_ids=torch.arange(12)[None] + 8).logits, model(x, position_ids=torch.arange(12)[None]).logits)


def causal_masks(x: torch.Tensor) -> dict[str, torch.Tensor]:
    length = x.shape[1]
    allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None].expand(x.shape[0], 1, -1, -1)
    return {"bool": allowed, "float": torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)}


@torch.no_grad()
def mask_4d(scheme: str) -> dict[str, float]:
    """A user's 4-D causal mask (bool and float) vs the 2-D path, and whether changing the last token
    moves any earlier logit under the bool mask (the future leaking)."""
    model = patched(scheme)
    x = ids(2, 10, 6)
    plain = model(x, attention_mask=torch.ones_like(x)).logits
    out = {f"{kind}_4d_vs_2d": diff(model(x, attention_mask=m).logits, plain) for kind, m in causal_masks(x).items()}
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 128
    bool_mask = causal_masks(x)["bool"]
    out["future_leak_bool_4d"] = diff(model(x, attention_mask=bool_mask).logits[:, :-1],
                                      model(y, attention_mask=bool_mask).logits[:, :-1])
    return out


def modules_to_save(scheme: str) -> dict[str, Any]:
    """peft LoRA with modules_to_save=['posenc_bias']: does the trainable copy get gradients, and does
    describe_modules name a module that is in the model after merge_and_unload?"""
    import peft

    model = patched(scheme)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                          modules_to_save=["posenc_bias"]))
    x = ids(2, 10, 7)
    wrapped.train()
    wrapped(input_ids=x, labels=x).loss.backward()
    copies = [m for n, m in wrapped.named_modules() if n.endswith("modules_to_save.default")]
    grads = [p.grad for m in copies for p in m.parameters()]
    merged = wrapped.merge_and_unload()
    in_model = {id(m) for m in merged.modules()}
    return {"trainable_copy_grad_norm": None if any(g is None for g in grads) or not grads
            else float(sum(g.norm() ** 2 for g in grads) ** 0.5),
            "describe_modules_in_merged_model": all(id(m) in in_model for m in hp.patching.describe_modules(merged))}


@torch.no_grad()
def deep_copied(scheme: str) -> dict[str, Any]:
    """deepcopy of a patched model: the copy's own weights, and unpatch(copy) leaving the original alone."""
    model = patched(scheme, arch="gpt2" if scheme == "rope" else "llama")
    x = ids(2, 10, 8)
    before = model(x).logits
    twin = copy.deepcopy(model)
    for module in hp.patching.describe_modules(twin):
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.3)
    out: dict[str, Any] = {"copy_moved_by_its_own_weights": diff(twin(x).logits, before),
                           "original_moved_by_changing_copy_weights": diff(model(x).logits, before)}
    hp.unpatch(twin)
    out["original_moved_by_unpatch_of_copy"] = attempt(lambda: diff(model(x).logits, before))
    out["original_still_described"] = hp.describe(model) is not None
    return out


@torch.no_grad()
def pickled(scheme: str) -> Any:
    """torch.save(model) then torch.load: max logit difference, or the failure."""
    model = patched(scheme, arch="gpt2" if scheme in ("rope", "learned") else "llama")
    x = ids(2, 10, 9)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return diff(torch.load(buffer, weights_only=False)(x).logits, model(x).logits)


@torch.no_grad()
def xpos_fp16(options: dict[str, Any], length: int, chunk: int = 512) -> dict[str, Any]:
    """xPos in fp16: chunked prefill (a DynamicCache, `chunk` tokens per call) of `length` tokens; the first
    position whose logits are not finite, and the largest difference from the same model in fp32."""
    from transformers import DynamicCache

    x = ids(1, length, 10)
    result: dict[str, Any] = {"length": length, "options": options}
    logits = {}
    for dtype in (torch.float32, torch.float16):
        model = hp.patch(tiny(layers=1, positions=length).to(dtype), "xpos", **options)
        cache = DynamicCache(config=model.config)
        logits[dtype] = torch.cat([model(x[:, i : i + chunk], past_key_values=cache, use_cache=True).logits.float()
                                   for i in range(0, length, chunk)], dim=1)
    bad = (~torch.isfinite(logits[torch.float16])).any(-1)[0].nonzero()
    result["first_nonfinite_position"] = int(bad[0]) if len(bad) else None
    finite = torch.isfinite(logits[torch.float16])
    result["max_diff_fp16_vs_fp32_where_finite"] = diff(logits[torch.float16][finite], logits[torch.float32][finite])
    return result


def measure() -> dict[str, Any]:
    score = ["t5", "kerple", "fire", "untied", "self_extend"]
    return {
        "1_positions": {
            "static_cache_left_padded": {s: attempt(lambda s=s: static_vs_dynamic(s)) for s in score + ["alibi"]},
            "packed_row_second_document": {s: attempt(lambda s=s: packed_row(s)) for s in score + ["alibi"]},
            "shift_position_ids_relative": {s: attempt(lambda s=s: shifted(s))
                                            for s in ["t5", "kerple", "fire", "self_extend", "alibi", "rope", "xpos"]},
        },
        "2_bool_4d_mask_future": {s: attempt(lambda s=s: mask_4d(s)) for s in score},
        "3_user_4d_mask_alibi": attempt(lambda: mask_4d("alibi")),
        "4_peft_modules_to_save": {s: attempt(lambda s=s: modules_to_save(s)) for s in ["t5", "kerple", "fire"]},
        "5_deepcopy": {s: attempt(lambda s=s: deep_copied(s)) for s in ["t5", "kerple", "alibi", "self_extend", "rope"]},
        "6_torch_save": {s: attempt(lambda s=s: pickled(s)) for s in ["t5", "alibi", "self_extend", "rope", "learned"]},
        "7_xpos_fp16": {
            "defaults_16k": attempt(lambda: xpos_fp16({}, 16384)),
            "scale_base_16_at_1k": attempt(lambda: xpos_fp16({"scale_base": 16.0}, 1024)),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="key of this run in the results file, e.g. before / after")
    args = parser.parse_args()
    package = Path(hp.__file__).resolve().parent
    commit = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    start = time.time()
    results = measure()
    results["_run"] = {"commit": commit, "package": str(package), "seconds": round(time.time() - start, 1),
                       "torch": torch.__version__, "transformers": transformers.__version__}
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    data[args.label] = results
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
