"""A shipped recipe over seeds on transformers' Trainer: the spread of its held-out results after training, beside
the number its README published from the training loop hf-posenc had before issue 46.

One run of a small fine-tuning is a draw of a noisy process (the head's and LoRA's initialisation and the data order
follow the seed), so a move of the training code is judged by whether the old number falls within the new spread.

    OMP_NUM_THREADS=1 nice python benchmarks/recipe_seeds.py minilm-l6/rope/smoke --seeds 42,0,1
    OMP_NUM_THREADS=1 nice python benchmarks/recipe_seeds.py minilm-l6/rope/smoke_baseline --seeds 42,0,1

Each run trains in its own folder under --work (no model saved), then appends its after-training cells to
benchmarks/results/recovery/recipe_seeds.jsonl (a rerun skips the recipe-seed pairs already there); the table of
every recipe there (n, mean, min..max per cell, and the published value) is rewritten to recipe_seeds.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

RESULTS = HERE / "results" / "recovery"
ROWS, TABLE = RESULTS / "recipe_seeds.jsonl", RESULTS / "recipe_seeds.md"
# recipe -> {cell: the value its README published from the pre-Trainer loop, one run at the recipe's own seed}
PUBLISHED: dict[str, dict[str, float]] = {
    "minilm-l6/rope/smoke": {"accuracy": 0.682, "f1": 0.720, "loss": 0.623},  # recipes/minilm-l6/README.md
    "minilm-l6/rope/smoke_baseline": {"accuracy": 0.710, "f1": 0.742, "loss": 0.554},
}


def cells(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of a run's after-training tables, by metric name (one dataset per table in a recipe)."""
    flat: dict[str, float] = {}
    for table in metrics.values():
        for cell in table.values():
            flat.update({k: float(v) for k, v in cell.items() if k in ("accuracy", "f1", "loss", "perplexity",
                                                                       "exact_match")})
    return flat


def run(name: str, seed: int, work: Path) -> dict[str, Any]:
    from hf_posenc.train import load_recipe, train

    out = work / f"{name.replace('/', '-')}-seed{seed}"
    recipe = load_recipe(name, ["--seed", str(seed), "--output_dir", str(out), "--save_model", "false",
                                "--plot", "false", "--save_strategy", "no"])
    t0, cpu0 = time.perf_counter(), time.process_time()
    record = train(recipe, overwrite=out.exists())
    after = next(r.metrics for r in record.runs if r.label == "after training")
    return {"recipe": name, "seed": seed, "cells": cells(after), "wall_s": round(time.perf_counter() - t0, 1),
            "cpu_s": round(time.process_time() - cpu0, 1), "host": platform.node(), "cores": _cores()}


def _cores() -> str:
    import os

    return f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| recipe | cell | n | mean | min..max | published (pre-Trainer loop, 1 run) | within the range |",
             "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["recipe"] for r in rows):
        runs = [r for r in rows if r["recipe"] == name]
        for cell in runs[0]["cells"]:
            values = [r["cells"][cell] for r in runs]
            old = PUBLISHED.get(name, {}).get(cell)
            inside = "" if old is None else ("yes" if min(values) <= old <= max(values) else "no")
            lines.append(f"| {name} | {cell} | {len(values)} | {sum(values) / len(values):.3f} | "
                         f"{min(values):.3f}..{max(values):.3f} | {'' if old is None else f'{old:.3f}'} | {inside} |")
    seeds = "; ".join(f"{r['recipe']} seed {r['seed']}: {r['cpu_s']} CPU-s, {r['wall_s']} s wall ({r['cores']})"
                      for r in rows)
    return "\n".join(lines) + f"\n\nOne process each, 1 thread (the recipes' `threads`); {seeds}.\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="a shipped recipe's name (`hf-posenc recipes`)")
    parser.add_argument("--seeds", default="42,0,1", help="comma-separated seeds")
    parser.add_argument("--work", default="/tmp/recipe_seeds", help="the run folders (scratch)")
    args = parser.parse_args()
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()] if ROWS.is_file() else []
    done = {(r["recipe"], r["seed"]) for r in rows}
    for seed in (int(s) for s in args.seeds.split(",")):
        if (args.recipe, seed) in done:
            continue
        print(f"{args.recipe} seed {seed}", flush=True)
        row = run(args.recipe, seed, Path(args.work))
        print(json.dumps(row), flush=True)
        rows.append(row)
        RESULTS.mkdir(parents=True, exist_ok=True)
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")
    TABLE.write_text(markdown(rows))
    print(TABLE.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
