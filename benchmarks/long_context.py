"""Long inputs with position terms (issue 12): peak memory and time of one forward, patched / stock sdpa,
each configuration in a fresh process, through `hp.patch` as a user runs it.

- `forward`: the tiny Llama (2 layers, d=256, 4 heads, vocab 1024, base model: no LM head) at 2k-32k
  tokens (every score- and attention-site scheme, default options) and SmolLM2-135M-Instruct (base model; ALiBi
  and T5) at 2k; stock (RoPE, sdpa) against the patched model on the default backend (`auto`)
  and, for the tiny Llama up to 8k, ALiBi and T5 on the materialised reference (`HF_POSENC_ATTENTION=dense`, what every patch ran before issue 12).
- `throughput`: ALiBi prefill tokens/s of a 2k prompt and decode tokens/s of 32 tokens after it (KV
  cache), tiny Llama, stock vs patched.

A child runs a warm-up forward at 1k, resets the RSS high-water mark (/proc/self/clear_refs), runs the
timed forward and reads `ru_maxrss` (`peak_mb`). Large tensors are mmapped (MALLOC_MMAP_THRESHOLD_),
so freed memory leaves RSS and the high-water mark is this forward's. One torch thread per child.

Run: `.venv/bin/python benchmarks/long_context.py` (~15 min on 2 shared cores); writes
benchmarks/results/long_context.{json,png,md}. A forward predicted to take more than `--max-seconds`
(Self-Extend at 32k) is skipped and says so; run it alone with `--models tiny-llama --schemes
self_extend --lengths 32768 --timeout 900 --out ...`. The committed results are one run that also had
SmolLM2 at 8k (34 min, 5 of them a Self-Extend 32k timeout the skip rule now avoids).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

OUT = Path(__file__).parent / "results" / "long_context.json"
SCHEMES = ["alibi", "t5", "fire", "kerple", "untied", "xpos", "self_extend"]
# SmolLM2 at 8k takes ~3 min a forward here (`--models smollm2 --lengths 8192`), at 16k ~12.
LENGTHS = {"tiny-llama": [2048, 8192, 16384, 32768], "smollm2": [2048]}
SMOLLM2_SCHEMES = ["alibi", "t5"]  # 30 layers: the other schemes would not fit the 20-minute budget
DENSE_LENGTHS = [2048, 8192]  # the materialised reference: (1, H, L, L) fp32 tensors beyond that
DENSE_SCHEMES = ["alibi", "t5"]
WARMUP_LENGTH = 1024
VOCAB = 1024


def tiny_llama(length: int) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4,
                                      num_hidden_layers=2, intermediate_size=1024, vocab_size=VOCAB,
                                      max_position_embeddings=max(length, 2048))
    return transformers.AutoModel.from_config(config, attn_implementation="sdpa").eval()


def smollm2(length: int) -> torch.nn.Module:
    from hf_posenc.loading import load_model

    return load_model("smollm2", task="base", dtype=torch.float32, attn_implementation="sdpa")


MODELS: dict[str, Callable[[int], torch.nn.Module]] = {"tiny-llama": tiny_llama, "smollm2": smollm2}


def patched(model_name: str, scheme: str, length: int) -> torch.nn.Module:
    import hf_posenc as hp

    model = MODELS[model_name](length)
    return model if scheme == "stock" else hp.patch(model, scheme)


def forward_child(model_name: str, scheme: str, length: int) -> dict[str, float]:
    model = patched(model_name, scheme, length)
    vocab = model.config.vocab_size
    with torch.no_grad():
        model(torch.randint(0, vocab, (1, WARMUP_LENGTH)), use_cache=False)
        ids = torch.randint(0, vocab, (1, length))
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark now starts here
        t0 = time.perf_counter()
        model(ids, use_cache=False)
        seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 3), "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def throughput_child(model_name: str, scheme: str, length: int, new: int = 32) -> dict[str, float]:
    """Prefill tokens/s of a `length` prompt, then decode tokens/s of `new` greedy steps (median of 3)."""
    from transformers import DynamicCache

    model = patched(model_name, scheme, length)
    ids = torch.randint(0, model.config.vocab_size, (1, length))
    prefill, decode = [], []
    with torch.no_grad():
        for _ in range(3):
            cache = DynamicCache(config=model.config)
            t0 = time.perf_counter()
            out = model(ids, past_key_values=cache)
            prefill.append(length / (time.perf_counter() - t0))
            del out
            token = ids[:, -1:]  # any token: the cost is what counts
            t0 = time.perf_counter()
            for _ in range(new):
                model(token, past_key_values=cache)
            decode.append(new / (time.perf_counter() - t0))
    return {"prefill_tok_s": round(sorted(prefill)[1], 1), "decode_tok_s": round(sorted(decode)[1], 1)}


CHILDREN = {"forward": forward_child, "throughput": throughput_child}


def run_child(config: dict[str, Any], timeout: float, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(config)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MALLOC_MMAP_THRESHOLD_": "65536",
           "HF_POSENC_ATTENTION": config["backend"]}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        return {"skipped": f"failed: {done.stderr.strip().splitlines()[-1][:300]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def configs(models: list[str], schemes: list[str], lengths: list[int] | None, throughput: bool) -> list[dict[str, Any]]:
    runs = []
    for model in models:
        for length in LENGTHS[model] if lengths is None else lengths:
            runs.append({"kind": "forward", "model": model, "scheme": "stock", "backend": "auto", "length": length})
            runs += [{"kind": "forward", "model": model, "scheme": s, "backend": "auto", "length": length}
                     for s in schemes if model != "smollm2" or s in SMOLLM2_SCHEMES]
            if length in DENSE_LENGTHS and model == "tiny-llama":
                runs += [{"kind": "forward", "model": model, "scheme": s, "backend": "dense", "length": length}
                         for s in DENSE_SCHEMES if s in schemes]
    if throughput:
        runs += [{"kind": "throughput", "model": "tiny-llama", "scheme": s, "backend": "auto", "length": 2048}
                 for s in ("stock", "alibi")]
    return runs


def skip_reason(config: dict[str, Any], results: list[dict[str, Any]], max_seconds: float) -> str | None:
    """A forward predicted (4x the run at half the length: attention is quadratic) to take longer
    than `max_seconds` is skipped, with the reason recorded."""
    half = next((r for r in results if "seconds" in r and r["length"] * 2 == config["length"] and
                 all(r[key] == config[key] for key in ("kind", "model", "scheme", "backend"))), None)
    if half is not None and 4 * half["seconds"] > max_seconds:
        return f"predicted {4 * half['seconds']:.0f} s (4x the {half['length']} run) > {max_seconds:.0f} s budget"
    return None


def with_ratios(results: list[dict[str, Any]]) -> None:
    stock = {(r["kind"], r["model"], r["length"]): r for r in results if r["scheme"] == "stock" and "skipped" not in r}
    for r in results:
        base = stock.get((r["kind"], r["model"], r["length"]))
        if base is None or r["scheme"] == "stock" or "skipped" in r:
            continue
        if r["kind"] == "forward":
            r["time_ratio"] = round(r["seconds"] / base["seconds"], 2)
            r["memory_ratio"] = round(r["peak_mb"] / base["peak_mb"], 2)
            r["extra_mb"] = round(r["peak_mb"] - base["peak_mb"], 1)
        else:
            r["prefill_ratio"] = round(base["prefill_tok_s"] / r["prefill_tok_s"], 2)  # time per token, patched / stock
            r["decode_ratio"] = round(base["decode_tok_s"] / r["decode_tok_s"], 2)


def markdown(results: list[dict[str, Any]], machine: str) -> str:
    """Memory and time ratios, patched / stock, one row per (model, scheme, backend), a column per length."""
    forward = [r for r in results if r["kind"] == "forward" and r["scheme"] != "stock"]
    rows = list(dict.fromkeys((r["model"], r["scheme"], r["backend"]) for r in forward))
    lengths = sorted({r["length"] for r in forward})
    head = "| model | scheme | backend | " + " | ".join(f"{n // 1024}k mem / time" for n in lengths) + " |"
    lines = [head, "|" + "---|" * (3 + len(lengths))]
    for model, scheme, backend in rows:
        cells = []
        for n in lengths:
            r = next((r for r in forward if (r["model"], r["scheme"], r["backend"], r["length"]) == (model, scheme, backend, n)), None)
            cells.append("" if r is None else "skipped" if "skipped" in r else f"{r['memory_ratio']}x / {r['time_ratio']}x")
        lines.append(f"| {model} | {scheme} | {backend} | " + " | ".join(cells) + " |")
    stock = [r for r in results if r["kind"] == "forward" and r["scheme"] == "stock" and "skipped" not in r]
    lines.append(f"\nStock sdpa, wall time of one forward in a fresh process ({machine}): " + ", ".join(f"{r['model']} {r['length'] // 1024}k {r['peak_mb']:.0f} MB {r['seconds']:.2f} s"
                                             for r in stock))
    for r in results:
        if r["kind"] == "throughput" and r["scheme"] != "stock" and "skipped" not in r:
            lines.append(f"\n{r['scheme']} at {r['length'] // 1024}k, {r['model']}: prefill {r['prefill_tok_s']} tok/s "
                         f"({r['prefill_ratio']}x stock time), decode {r['decode_tok_s']} tok/s ({r['decode_ratio']}x)")
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.ticker

    from hf_posenc import plots

    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = dict(zip(SCHEMES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, (key, label) in zip(axes, [("memory_ratio", "peak RSS / stock"), ("time_ratio", "time / stock")]):
        for scheme in SCHEMES:
            for backend, style in (("auto", "-"), ("dense", ":")):
                points = sorted((r["length"], r[key]) for r in results if r["kind"] == "forward" and r["model"] == "tiny-llama"
                                and r["scheme"] == scheme and r["backend"] == backend and key in r)
                if points:
                    ax.plot(*zip(*points), style, marker="o", color=colors[scheme], label=f"{scheme} ({backend})")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel=label, title=f"tiny Llama, one forward: {label}")
        ax.set_xticks(LENGTHS["tiny-llama"], [f"{n // 1024}k" for n in LENGTHS["tiny-llama"]])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    plots.legend_outside(fig, fontsize=7)
    plots.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(LENGTHS))
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--lengths", help="comma-separated lengths for every model (default: `LENGTHS`)")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=200.0, help="skip forwards predicted to take longer")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per child; 1 because oversubscribed cores make 2 OpenMP threads ~9x slower")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.child:
        config = json.loads(args.child)
        print(json.dumps(CHILDREN[config["kind"]](config["model"], config["scheme"], config["length"])))
        return
    results: list[dict[str, Any]] = []
    lengths = None if args.lengths is None else [int(n) for n in args.lengths.split(",")]
    for config in configs(args.models.split(","), args.schemes.split(","), lengths, not args.no_throughput):
        reason = skip_reason(config, results, args.max_seconds)
        outcome = {"skipped": reason} if reason else run_child(config, args.timeout, args.threads)
        results.append({**config, **outcome})
        print(json.dumps(results[-1]), flush=True)
    with_ratios(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs, {args.threads} torch thread(s)"
    args.out.write_text(json.dumps({"machine": machine, "torch": torch.__version__, "results": results}, indent=1))
    args.out.with_suffix(".md").write_text(markdown(results, machine))
    plot(results, args.out.with_suffix(".png"))
    print(markdown(results, machine))


if __name__ == "__main__":
    main()
