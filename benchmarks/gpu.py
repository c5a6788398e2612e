"""Cost of a patch on a GPU (issue 40), stage 2 of `scripts/gpu-check`: patched / stock prefill time, per-token
decode time and peak memory at 2k, 8k and 32k tokens in bf16, for rope, yarn, alibi, t5, nope, p_rope and a
per-layer map (RoPE in three layers of four, NoPE in the fourth: SmolLM3's layout), on each attention backend
the scheme can use:

- schemes that leave the scores alone run on transformers' own kernels, stock and patched alike: `sdpa`,
  `flex_attention`, and `flash_attention_2` when flash-attn imports;
- score biases (alibi, t5) run under hf-posenc's `posenc_sdpa`, whose backends are `auto`, `chunked`, `flex`,
  `flash_alibi` (ALiBi, flash-attn only) and `dense` (the materialised (B, H, L, L) bias: 8k tokens at most),
  against stock `sdpa`.

The model is a Llama built from a config (random weights: time and memory do not depend on them), 8 layers of
1024 on the GPU; `--tiny` runs 4 layers of 32 at 32 and 64 tokens on the CPU in seconds (the dry run of
`scripts/gpu-check`). The logits of the last token only are computed (`logits_to_keep=1`), so the vocabulary's
(L, V) logits do not drown the positions' cost. Each scheme's default path runs at every length before the other
backends. A cell that fails records its error; the JSON and Markdown are rewritten after every cell, and cells
past `--budget` seconds are recorded as not run.

    python benchmarks/gpu.py --json out/gpu/2-bench.json --md out/gpu/2-bench.md --budget 160
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import DynamicCache

import hf_posenc as hp
from hf_posenc import compat
from hf_posenc.attention import attention_backend

SCHEMES: dict[str, tuple[Any, dict[str, Any]]] = {
    "rope": ("rope", {"theta": 500_000.0}),
    "yarn": ("yarn", {"factor": 4.0}),
    "alibi": ("alibi", {}),
    "t5": ("t5", {}),
    "nope": ("nope", {}),
    "p_rope": ("p_rope", {"p": 0.5}),
    "nope_every4": ({"rope": [0, 1, 2], "nope": [3]}, {}),  # layers of 4: repeated down a deeper model
}
SCORE = {"alibi", "t5"}  # a bias added to the scores: hf-posenc's posenc_sdpa and its backends
DENSE_MAX = 8192  # the dense bias is (B, H, L, L): 16 GiB in bf16 at 32k tokens and 16 heads


@dataclass(frozen=True)
class Size:
    layers: int
    width: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    lengths: tuple[int, ...]
    repeats: int
    decode_steps: int


GPU = Size(layers=8, width=1024, heads=16, kv_heads=4, mlp=2816, vocab=32000, lengths=(2048, 8192, 32768),
           repeats=3, decode_steps=16)
TINY = Size(layers=4, width=32, heads=4, kv_heads=2, mlp=64, vocab=128, lengths=(32, 64), repeats=1, decode_steps=2)


def layer_map(scheme: Any, layers: int) -> Any:
    """A layer map of 4 repeated down `layers` (a name is returned as is)."""
    if not isinstance(scheme, dict):
        return scheme
    return {name: [i for i in range(layers) if i % 4 in ids] for name, ids in scheme.items()}


def build(size: Size, attn: str, device: torch.device) -> torch.nn.Module:
    """The stock Llama of `size` on `device` in bf16 (random weights, built there)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=size.width, intermediate_size=size.mlp, num_hidden_layers=size.layers,
        num_attention_heads=size.heads, num_key_value_heads=size.kv_heads, vocab_size=size.vocab,
        max_position_embeddings=max(size.lengths) + size.decode_steps + 8)
    with device:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.bfloat16)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def prefill(model: torch.nn.Module, ids: torch.Tensor) -> float:
    sync(ids.device)
    t0 = time.perf_counter()
    model(ids, use_cache=False, logits_to_keep=1)
    sync(ids.device)
    return time.perf_counter() - t0


@torch.no_grad()
def decode(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> float:
    """Seconds per generated token after a prefill of `ids` into a dynamic cache (two steps of warm-up)."""
    cache = {compat.cache_kwarg(model): DynamicCache(config=model.config)}
    token = model(ids, use_cache=True, logits_to_keep=1, **cache).logits[:, -1:].argmax(-1)
    for _ in range(2):
        token = model(token, use_cache=True, **cache).logits[:, -1:].argmax(-1)
    sync(ids.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        token = model(token, use_cache=True, **cache).logits[:, -1:].argmax(-1)
    sync(ids.device)
    return (time.perf_counter() - t0) / steps


@torch.no_grad()
def peak_memory(model: torch.nn.Module, ids: torch.Tensor) -> int | None:
    """Bytes a prefill allocates above what is held before it (CUDA's allocator statistics; None elsewhere)."""
    if ids.device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model(ids, use_cache=False, logits_to_keep=1)
    return torch.cuda.max_memory_allocated() - before


def measure(model: torch.nn.Module, size: Size, length: int) -> dict[str, Any]:
    """Median prefill seconds (after two warm-ups: compiled kernels, FlexAttention's, may compile again on the second
    call of a shape), decode seconds per token and peak prefill bytes."""
    device = next(model.parameters()).device
    ids = torch.randint(0, size.vocab, (1, length), generator=torch.Generator().manual_seed(length)).to(device)
    prefill(model, ids)
    prefill(model, ids)
    times = [prefill(model, ids) for _ in range(size.repeats)]
    return {"prefill_s": statistics.median(times), "decode_s": decode(model, ids, size.decode_steps),
            "peak_bytes": peak_memory(model, ids)}


def ratios(stock: dict[str, Any], patched: dict[str, Any]) -> dict[str, Any]:
    def ratio(key: str) -> float | None:
        return round(patched[key] / stock[key], 3) if stock.get(key) and patched.get(key) is not None else None

    return {"prefill": ratio("prefill_s"), "decode": ratio("decode_s"), "peak_memory": ratio("peak_bytes"),
            "stock": stock, "patched": patched}


def backends(label: str, length: int, device: torch.device) -> list[tuple[str, str, str | None]]:
    """(stock attn implementation, hf-posenc backend or '', reason it cannot run here or None) for the backends
    `label` can use."""
    flash = None if device.type == "cuda" and importlib.util.find_spec("flash_attn") else "flash-attn not importable"
    flex = None if device.type == "cuda" else "FlexAttention compiles for 10-18 s per shape on a CPU: GPU only"
    if label in SCORE:
        rows = [("sdpa", "auto", None), ("sdpa", "chunked", None), ("sdpa", "flex", flex)]
        rows += [("sdpa", "flash_alibi", flash)] if label == "alibi" else []
        return rows + [("sdpa", "dense", None if length <= DENSE_MAX else f"a (B, H, L, L) bias past {DENSE_MAX}")]
    return [("sdpa", "", None), ("flex_attention", "", flex), ("flash_attention_2", "", flash)]


def patched_run(model: torch.nn.Module, label: str, backend: str, size: Size, length: int) -> dict[str, Any]:
    """Measure `model` patched with `label` (on hf-posenc's `backend` if any), then unpatch it."""
    scheme, options = SCHEMES[label]
    device = next(model.parameters()).device
    hp.patch(model, layer_map(scheme, size.layers), **options)
    try:
        model.to(device)
        if backend:
            with attention_backend(backend):
                return measure(model, size, length)
        return measure(model, size, length)
    finally:
        hp.unpatch(model)


class Bench:
    """The cells measured so far, written out after each one."""

    def __init__(self, args: argparse.Namespace, size: Size, device: torch.device) -> None:
        self.args, self.size, self.device = args, size, device
        self.start = time.monotonic()
        self.models: dict[str, torch.nn.Module] = {}
        self.data: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "transformers": transformers.__version__, "hf_posenc": hp.__version__, "dtype": "bfloat16",
            "model": {"family": "llama", **size.__dict__}, "budget_s": args.budget, "cells": []}

    def model(self, attn: str) -> torch.nn.Module:
        if attn not in self.models:
            self.models[attn] = build(self.size, attn, self.device)
        return self.models[attn]

    def cell(self, label: str, length: int, attn: str, backend: str, skip: str | None) -> dict[str, Any]:
        row: dict[str, Any] = {"scheme": label, "length": length, "attention": attn, "backend": backend or attn}
        if skip is None and time.monotonic() - self.start > self.args.budget:
            skip = "not run: the budget was spent"
        if skip is not None:
            return {**row, "skipped": skip}
        try:
            model = self.model(attn)
            # stock measured beside each cell, not once per length: on the H200 a stock decode measured first at each
            # length took 43-65 ms a token against 6-8 for patched rope (same operators on the CPU), cause unknown
            stock = measure(model, self.size, length)
            return {**row, **ratios(stock, patched_run(model, label, backend, self.size, length))}
        except Exception as err:  # a cell that fails is a finding: record it and go on
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return {**row, "error": f"{type(err).__name__}: {str(err)[:400]}"}

    def run(self) -> None:
        """Each scheme's default path (stock sdpa's kernels, posenc_sdpa's `auto`) at every length first, shortest
        first, then the other backends, whose compiles (FlexAttention) may take what is left of the budget."""
        cells = [(label, length, *b) for length in self.size.lengths for label in SCHEMES
                 for b in backends(label, length, self.device)]
        default = [c for c in cells if c[2] == "sdpa" and c[3] in ("", "auto")]
        for label, length, attn, backend, skip in default + [c for c in cells if c not in default]:
            row = self.cell(label, length, attn, backend, skip)
            self.data["cells"].append(row)
            print(line(row), flush=True)
            self.write()

    def write(self) -> None:
        self.data["seconds"] = round(time.monotonic() - self.start, 1)
        Path(self.args.json).write_text(json.dumps(self.data, indent=2) + "\n")
        Path(self.args.md).write_text(markdown(self.data))


def line(row: dict[str, Any]) -> str:
    what = f"{row['scheme']:>12s} {row['backend']:>17s} @ {row['length']:>6d}"
    if "skipped" in row or "error" in row:
        return f"{what}: {row.get('skipped') or row['error']}"
    return f"{what}: prefill x{row['prefill']}, decode x{row['decode']}, peak memory x{row['peak_memory']}"


def markdown(data: dict[str, Any]) -> str:
    m = data["model"]
    lines = [f"# Patched / stock on {data['device']}: torch {data['torch']}, transformers {data['transformers']}, "
             f"bf16, Llama {m['layers']} x {m['width']} ({m['heads']} heads, {m['kv_heads']} kv)\n",
             "| tokens | scheme | backend | prefill | decode | peak memory | patched prefill ms | note |",
             "|---|---|---|---|---|---|---|---|"]
    for row in sorted(data["cells"], key=lambda r: (r["length"], list(SCHEMES).index(r["scheme"]))):
        note = row.get("skipped") or row.get("error") or ""
        cells = [str(row["length"]), row["scheme"], row["backend"]]
        if "prefill" in row:
            cells += [f"{row[k]}" for k in ("prefill", "decode", "peak_memory")]
            cells.append(f"{1000 * row['patched']['prefill_s']:.1f}")
        else:
            cells += ["–"] * 4
        lines.append("| " + " | ".join(cells + [note[:160].replace("|", "/")]) + " |")
    where = "a lent machine: nothing else ran on it" if data["device"] != "cpu" else "load not recorded"
    return "\n".join(lines) + (f"\n\n{data['seconds']} s on {data['device']} ({where}); ratios are patched / stock on "
                                "the same kernels and card.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default="benchmarks/results/gpu/bench.json")
    parser.add_argument("--md", default="benchmarks/results/gpu/bench.md")
    parser.add_argument("--budget", type=float, default=160.0, help="seconds; later cells are recorded as not run")
    parser.add_argument("--tiny", action="store_true", help="4 layers of 32 at 32 and 64 tokens, on the CPU")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    for path in (args.json, args.md):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, TINY if args.tiny else GPU, torch.device("cuda" if cuda else "cpu"))
    try:
        bench.run()
    except KeyboardInterrupt:  # gpu-check's budget: what was measured is already written
        bench.data["interrupted"] = True
        bench.write()
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
