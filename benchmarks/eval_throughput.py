"""Perplexity-evaluation speed and memory against a bare `model(input_ids)` loop over the same windows.

Target: `perplexity_by_length` runs at >= 0.9x the tokens/s of the bare loop, with a peak memory
no higher. The bare loop materialises (L, vocab) fp32 logits per window; the evaluation sends only
LOGIT_CHUNK rows at a time through the output head. Timings alternate between the two and keep
the best of `--repeats`; the ratio is taken on process CPU time, which other processes on a
shared machine disturb far less than wall time (both are reported). Peak memory is the highest
resident set size above the level before the run, sampled every 2 ms.

    python benchmarks/eval_throughput.py [--model smollm2] [--lengths 512,2048] [--windows 2]
Writes benchmarks/results/eval_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from hf_posenc import data, evaluation, loading, results

RESULTS = Path(__file__).parent / "results"
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measure(run: Callable[[], object]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak resident bytes above the starting level) of one call."""
    start, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done.set()
    sampler.join()
    return wall, cpu, max(peak[0], _rss()) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "eval_throughput.json"))
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    model, tokenizer = loading.load(args.model, dtype=torch.float32)
    ids = evaluation.text_token_ids(tokenizer, data.long_text("kjv"), max(lengths) * args.windows)

    rows = []
    for length in lengths:
        windows = ids[: length * args.windows].view(args.windows, length)

        def bare() -> None:
            with torch.no_grad():
                for window in windows:
                    model(window[None])

        def ours() -> None:
            evaluation.perplexity_by_length(model, ids, [length], max_windows=args.windows)

        ours()  # warm-up (allocator, kernels) before any timing
        best = {name: [float("inf"), float("inf"), 0] for name in ("bare", "eval")}
        for _ in range(args.repeats):
            for name, run in (("bare", bare), ("eval", ours)):
                wall, cpu, peak = measure(run)
                best[name] = [min(best[name][0], wall), min(best[name][1], cpu), max(best[name][2], peak)]
        tokens = length * args.windows
        row = {"length": length, "windows": args.windows}
        for name, (wall, cpu, peak) in best.items():
            row[f"{name}_tokens_per_s"] = round(tokens / wall, 1)
            row[f"{name}_tokens_per_cpu_s"] = round(tokens / cpu, 1)
            row[f"{name}_peak_mb"] = round(peak / 2**20, 1)
        row["full_logits_mb"] = round(length * model.config.vocab_size * 4 / 2**20, 1)
        row["speed_ratio_cpu"] = round(row["eval_tokens_per_cpu_s"] / row["bare_tokens_per_cpu_s"], 3)
        row["speed_ratio_wall"] = round(row["eval_tokens_per_s"] / row["bare_tokens_per_s"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {
        "model": args.model,
        "target": "speed_ratio_cpu >= 0.9 and eval_peak_mb <= bare_peak_mb",
        "threads": torch.get_num_threads(),
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
        "versions": results.versions(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
