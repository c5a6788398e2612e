"""Long inputs with position terms (issue 12): peak memory and time of one forward at 2k-32k tokens,
stock sdpa (causal, RoPE, no bias) against every bias scheme on every `hf_posenc.fast_attention`
backend, each configuration in a fresh process.

- `layer`: one attention call, B=1, 4 heads of 64;
- `model`: a tiny Llama (2 layers, d=256, 4 heads, vocab 1024, no LM head) whose attention function
  calls `biased_attention` with the scheme's own module (`scheme.module(options, facts)`, default
  options) and a `MaskSpec` from its mask function; rotation switched off as `patch` does. (The patch
  itself does not route through fast_attention yet: that is issue 12 phase B.)

A child runs one warm-up forward (at the measured length for flex, which compiles there: `warmup_s`;
2k for the others), resets the RSS high-water mark (/proc/self/clear_refs), runs the timed forward and
reads `resource.getrusage(...).ru_maxrss` (`peak_mb`; `forward_mb` is the part above the RSS just before
the forward; large tensors are mmapped so freed memory leaves RSS). One torch thread per child. Dense runs stop at 8k (their (L, L) tensors would not fit), and a
run whose 16k time predicts more than `--max-seconds` at 32k is skipped; both are recorded with the reason.

Run: `.venv/bin/python benchmarks/long_context.py` (about an hour on 2 CPU cores); results in
benchmarks/results/long_context.json and long_context.png.
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
from typing import Any

import torch
import torch.nn.functional as F

OUT = Path(__file__).parent / "results" / "long_context.json"
SCHEMES = ["alibi", "t5", "fire", "kerple", "untied", "self_extend"]
BACKENDS = ["flex", "chunked", "dense"]
LENGTHS = [2048, 8192, 16384, 32768]
DENSE_LIMIT = 8192
WARMUP_LENGTH = 2048
HEADS, HEAD_DIM, HIDDEN = 4, 64, 256


def tiny_llama() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                      num_hidden_layers=2, intermediate_size=4 * HIDDEN, vocab_size=1024,
                                      max_position_embeddings=max(LENGTHS))
    return transformers.AutoModel.from_config(config, attn_implementation="sdpa").eval()


def scheme_module(model: torch.nn.Module, scheme: str) -> torch.nn.Module:
    """The module `patch` would install for `scheme` on this model, with default options."""
    from hf_posenc.registry import adapter_for, get_scheme

    spec, facts = get_scheme(scheme), adapter_for(model).facts(model)
    return spec.module(spec.resolve(spec.validate({}), facts), facts)


def use_fast_attention(model: torch.nn.Module, bias: torch.nn.Module, backend: str) -> None:
    """Route the model's attention through biased_attention (no cache: positions are 0..L-1)."""
    from hf_posenc import compat
    from hf_posenc.fast_attention import MaskSpec, biased_attention
    from hf_posenc.schemes.rope import Rotary

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        positions = torch.arange(query.shape[2], device=query.device)[None].expand(query.shape[0], -1)
        return biased_attention(query, key, value, q_pos=positions, k_pos=positions, bias=bias, mask=attention_mask,
                                scaling=scaling, backend=backend)

    def mask(*args: Any, **kwargs: Any) -> MaskSpec:
        return MaskSpec(causal=True)

    compat.register_attention("bench_fast_attention", attention, mask)
    compat.set_attn_implementation(model, "bench_fast_attention")
    model.rotary_emb = Rotary(HEAD_DIM, {}, 0.0, max(LENGTHS))  # cos=1, sin=0: the scheme carries positions


def build(level: str, scheme: str, backend: str):
    """`make(length)` -> a zero-argument forward on fresh inputs of that length."""
    from hf_posenc.fast_attention import MaskSpec, biased_attention

    model = tiny_llama()
    bias = None if scheme == "stock" else scheme_module(model, scheme)
    if level == "model":
        if bias is not None:
            use_fast_attention(model, bias, backend)

        def make_model(length: int):
            ids = torch.randint(0, 1024, (1, length))
            return lambda: model(ids, use_cache=False).last_hidden_state

        return make_model

    def make_layer(length: int):
        q, k, v = (torch.randn(1, HEADS, length, HEAD_DIM) for _ in range(3))
        positions = torch.arange(length)[None]
        if bias is None:  # as transformers' sdpa attention function returns it
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous()
        return lambda: biased_attention(q, k, v, q_pos=positions, k_pos=positions, bias=bias, mask=MaskSpec(),
                                        backend=backend)[0]

    return make_layer


def child(level: str, scheme: str, backend: str, length: int) -> dict[str, float]:
    """Warm-up forward (at the same length for flex, which compiles a kernel per padded length), then
    the measured one; the RSS high-water mark is reset in between."""
    with torch.no_grad():
        make = build(level, scheme, backend)
        warmup = make(length if backend == "flex" else min(length, WARMUP_LENGTH))
        t0 = time.perf_counter()
        warmup()
        warmup_s = time.perf_counter() - t0
        del warmup
        forward = make(length)
        before = rss_mb()
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark now starts here
        t0 = time.perf_counter()
        forward()
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": round(seconds, 3), "warmup_s": round(warmup_s, 3), "peak_mb": round(peak, 1),
            "forward_mb": round(peak - before, 1)}


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def run_child(config: dict[str, Any], timeout: float, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(config)]
    # Tensors above 64 kB mmapped and unmapped on free: RSS then follows live memory instead of what
    # malloc keeps from earlier forwards, so the reset high-water mark is this forward's peak.
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MALLOC_MMAP_THRESHOLD_": "65536"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        return {"skipped": f"failed: {done.stderr.strip().splitlines()[-1][:300]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def skip_reason(config: dict[str, Any], results: list[dict[str, Any]], max_seconds: float) -> str | None:
    length = config["length"]
    if config["backend"] == "dense" and length > DENSE_LIMIT:
        gb = 3 * HEADS * length**2 * 4 / 1e9
        return f"dense materialises (1, {HEADS}, L, L) fp32 logits, weights and mask: ~{gb:.0f} GB at {length}"
    same = (config["level"], config["scheme"], config["backend"], length // 2)
    half = next((r for r in results if (r["level"], r["scheme"], r["backend"], r["length"]) == same and "seconds" in r), None)
    if length == max(LENGTHS) and half is not None and 4 * half["seconds"] > max_seconds:
        return f"predicted {4 * half['seconds']:.0f} s per forward (4x the {length // 2} run) > {max_seconds:.0f} s budget"
    return None


def with_ratios(results: list[dict[str, Any]]) -> None:
    stock = {(r["level"], r["length"]): r for r in results if r["scheme"] == "stock" and "seconds" in r}
    for r in results:
        base = stock.get((r["level"], r["length"]))
        if base is not None and "seconds" in r and r["scheme"] != "stock":
            r["time_ratio"] = round(r["seconds"] / base["seconds"], 2)
            r["memory_ratio"] = round(r["peak_mb"] / base["peak_mb"], 2)
            r["extra_mb"] = round(r["peak_mb"] - base["peak_mb"], 1)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({r["level"] for r in results})
    fig, axes = plt.subplots(len(levels), 2, figsize=(12, 4.5 * len(levels)), squeeze=False)
    styles = {"flex": "-", "chunked": "--", "dense": ":"}
    colors = dict(zip(SCHEMES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for row, level in enumerate(levels):
        for col, (key, label) in enumerate([("memory_ratio", "peak RSS / stock"), ("time_ratio", "time / stock")]):
            ax = axes[row][col]
            for scheme in SCHEMES:
                for backend in BACKENDS:
                    points = sorted((r["length"], r[key]) for r in results if r["level"] == level
                                    and r["scheme"] == scheme and r["backend"] == backend and key in r)
                    if points:
                        ax.plot(*zip(*points), styles[backend], marker="o", color=colors[scheme],
                                label=f"{scheme} ({backend})")
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel=label, title=f"{level}: {label}")
            ax.set_xticks(LENGTHS, [f"{n // 1024}k" for n in LENGTHS])
    axes[0][1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--levels", default="layer,model")
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--max-seconds", type=float, default=180.0, help="budget of one 32k forward")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per child; 1 because oversubscribed cores make 2 OpenMP threads ~9x slower")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.child:
        config = json.loads(args.child)
        print(json.dumps(child(config["level"], config["scheme"], config["backend"], config["length"])))
        return
    configs = [{"level": level, "scheme": "stock", "backend": "sdpa", "length": n}
               for level in args.levels.split(",") for n in map(int, args.lengths.split(","))]
    configs += [{"level": level, "scheme": s, "backend": b, "length": n} for level in args.levels.split(",")
                for s in args.schemes.split(",") for b in args.backends.split(",") for n in map(int, args.lengths.split(","))]
    results: list[dict[str, Any]] = []
    for config in configs:
        reason = skip_reason(config, results, args.max_seconds)
        outcome = {"skipped": reason} if reason else run_child(config, max(3 * args.max_seconds, 600), args.threads)
        results.append({**config, **outcome})
        print(json.dumps(results[-1]), flush=True)
    with_ratios(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs, {args.threads} torch thread(s)",
        "torch": torch.__version__,
        "setup": {"layer": f"B=1, {HEADS} heads x {HEAD_DIM}", "model": f"Llama 2 layers, d={HIDDEN}, {HEADS} heads, vocab 1024"},
        "results": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
