"""Cost of a patch, measured side by side with the stock model in one run.

- prefill at 512 and 2048 tokens, per-token decode at 512 context (KV cache):
  GPT-2 (4 layers x 768) stock vs patched to `rope`; a Llama of the same size stock vs `alibi`
- peak memory of a 2048-token prefill (fresh process each, sampled RSS above the loaded model)
- `patch()` wall time on SmolLM2-135M-Instruct and whether any existing weight was copied

Timings interleave stock and patched runs and keep the median of repeats. Results go to
benchmarks/results/overhead.json. Run: `.venv/bin/python benchmarks/overhead.py`.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import transformers
from transformers import DynamicCache

import hf_posenc as hp

OUT = Path(__file__).parent / "results" / "overhead.json"
CELLS = {"gpt2": "rope", "llama": "alibi"}


def build(arch: str, patched: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(n_layer=4, n_embd=768, n_head=12, n_positions=4096)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=768, num_attention_heads=12,
                                          num_key_value_heads=12, intermediate_size=3072, vocab_size=50257,
                                          max_position_embeddings=4096)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return hp.patch(model, CELLS[arch]) if patched else model


@torch.no_grad()
def prefill(model: torch.nn.Module, n: int) -> float:
    ids = torch.randint(0, 50000, (1, n))
    t0 = time.perf_counter()
    model(ids, use_cache=False)
    return time.perf_counter() - t0


@torch.no_grad()
def decode(model: torch.nn.Module, context: int, steps: int = 32) -> float:
    ids = torch.randint(0, 50000, (1, context))
    cache = DynamicCache(config=model.config)
    out = model(ids, past_key_values=cache, use_cache=True)
    token = out.logits[:, -1:].argmax(-1)
    t0 = time.perf_counter()
    for _ in range(steps):
        token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    return (time.perf_counter() - t0) / steps


def ratio(stock: list[float], patched: list[float]) -> dict[str, float]:
    s, p = statistics.median(stock), statistics.median(patched)
    return {"stock_s": round(s, 5), "patched_s": round(p, 5), "ratio": round(p / s, 3)}


def timings(repeats: int) -> dict:
    results = {}
    for arch, scheme in CELLS.items():
        models = {False: build(arch, False), True: build(arch, True)}
        for name, fn in [("prefill_512", lambda m: prefill(m, 512)), ("prefill_2048", lambda m: prefill(m, 2048)),
                         ("decode_at_512", lambda m: decode(m, 512))]:
            fn(models[False]), fn(models[True])  # warm-up
            runs = {False: [], True: []}
            for _ in range(repeats):
                for patched in (False, True):
                    runs[patched].append(fn(models[patched]))
            results[f"{arch}->{scheme}/{name}"] = ratio(runs[False], runs[True])
            print(f"{arch}->{scheme} {name}: {results[f'{arch}->{scheme}/{name}']}", flush=True)
    return results


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def memory_probe(arch: str, patched: bool) -> None:
    """Peak resident memory above the loaded model during one 2048-token prefill, sampled every
    millisecond (max RSS would report the model's own initialisation instead)."""
    model = build(arch, patched)
    prefill(model, 64)  # allocator warm-up
    before, peak, done = rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    prefill(model, 2048)
    done.set()
    sampler.join()
    print(peak[0] - before)


def memory() -> dict:
    results = {}
    for arch, scheme in CELLS.items():
        mib = {}
        for patched in (False, True):
            cmd = [sys.executable, __file__, "--memory-probe", arch] + (["--patched"] if patched else [])
            mib[patched] = float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[-1])
        results[f"{arch}->{scheme}/prefill_2048_peak_MiB"] = {
            "stock": round(mib[False], 1), "patched": round(mib[True], 1), "ratio": round(mib[True] / mib[False], 3)}
        print(f"{arch}->{scheme} peak MiB: {results[f'{arch}->{scheme}/prefill_2048_peak_MiB']}", flush=True)
    return results


def patch_time() -> dict:
    from hf_posenc.loading import load_model

    model = load_model("smollm2", dtype=torch.float32)
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    times = {}
    for scheme, options in [("yarn", {"factor": 4.0}), ("alibi", {}), ("nope", {}), ("rope", {"partial": 0.5})]:
        t0 = time.perf_counter()
        hp.patch(model, scheme, **options)
        times[scheme] = round(time.perf_counter() - t0, 4)
        copied = [n for n, p in model.named_parameters() if n in pointers and p.data_ptr() != pointers[n]]
        hp.unpatch(model)
        assert not copied, f"{scheme} copied {copied[:3]}"
    print(f"patch() on SmolLM2-135M-Instruct: {times} s, no existing weight copied", flush=True)
    return {"smollm2_patch_seconds": times, "existing_weights_copied": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-probe", choices=sorted(CELLS))
    parser.add_argument("--patched", action="store_true")
    args = parser.parse_args()
    if args.memory_probe:
        return memory_probe(args.memory_probe, args.patched)
    torch.set_num_threads(torch.get_num_threads())
    result = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, CPU",
              "torch": torch.__version__, "transformers": transformers.__version__, "repeats": args.repeats,
              "targets": {"prefill": 1.03, "decode": 1.05, "memory": 1.05, "patch_seconds": 0.1},
              "timings": timings(args.repeats), "memory": memory(), "patch": patch_time()}
    OUT.write_text(json.dumps(result, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
