"""RULER (Hsieh et al. 2024) on SmolLM2-135M under position swaps without training (issue 20): original
RoPE, YaRN x2 and x4, ALiBi and NoPE, through `hf-posenc eval --suite ruler`'s code (lm-eval's RULER
generators and scorer, offline, essay haystack = the KJV), each task x length with its n and 95%
Wilson interval.

One process loads the model once and patches it per arm; every cell is written to
benchmarks/results/ruler_smollm2.json (an `eval` results file: `hf-posenc eval --compare` reads it) as
it finishes, lengths in the outer loop so every arm has its short lengths before any arm gets the long
ones. Then the heat-map (ruler_smollm2.png) and the Markdown table (ruler_smollm2.md).

Cost on this machine (2 cores shared by 5 engineers, nice): a 1k-token RULER prompt is ~10-20 s of
prefill and a 128-token greedy answer as much again, so answers are capped (`--gen-tokens`, default 16:
a needle's 7-digit number is ~8 SmolLM2 tokens; vt keeps RULER's 30 only if the cap allows) and the
committed run is what fitted before the deadline (see the README's RULER section).

Run: `.venv/bin/python benchmarks/ruler_smollm2.py [--tasks ... --lengths ... --samples N --arms ...]`;
`--report-only` redraws the plot and table from the JSON (of a run stopped early: cells not reached are "–").
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

import hf_posenc
from hf_posenc import plots, results
from hf_posenc.evaluation.ruler import HAYSTACK, ruler_scores
from hf_posenc.loading import load

OUT = Path(__file__).parent / "results" / "ruler_smollm2.json"
# arm -> (scheme, options); None keeps SmolLM2's own RoPE (theta 1e5, trained to 8192 tokens)
ARMS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "original (rope)": None,
    "yarn x2": ("yarn", {"factor": 2.0}),
    "yarn x4": ("yarn", {"factor": 4.0}),
    "alibi (no training)": ("alibi", {}),
    "nope (no training)": ("nope", {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="niah_single_1,niah_single_2,niah_multikey_1,vt,cwe")
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--gen-tokens", type=int, default=16)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--report-only", action="store_true",
                        help="only redraw the plot and table from --out (e.g. of a run stopped at the deadline)")
    args = parser.parse_args()
    if args.report_only:
        write_report(results.load(args.out), Path(args.out))
        return
    tasks, arms = args.tasks.split(","), args.arms.split(",")
    lengths = [int(n) for n in args.lengths.split(",")]
    torch.manual_seed(0)
    model, tokenizer = load("smollm2", dtype=torch.float32)
    record = results.Results("eval", "smollm2", settings={
        "suite": ["ruler:" + ",".join(tasks)], "lengths": lengths, "samples": args.samples,
        "gen_tokens": args.gen_tokens, "seed": 0, "haystack": HAYSTACK, "dtype": "float32",
        "threads": torch.get_num_threads()})
    runs = {}
    for arm in arms:
        spec = ARMS[arm]
        runs[arm] = results.Run(arm, spec[0] if spec else None, dict(spec[1]) if spec else {})
        record.runs.append(runs[arm])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for length in lengths:
        for arm in arms:
            hf_posenc.unpatch(model)
            if ARMS[arm] is not None:
                hf_posenc.patch(model, ARMS[arm][0], **ARMS[arm][1])
            runs[arm].posenc = model.config.posenc if hf_posenc.describe(model) else None
            for task in tasks:
                start = time.perf_counter()
                scores = ruler_scores(model, tokenizer, [task], [length], args.samples, gen_tokens=args.gen_tokens)
                cell = scores[task][length]
                cell["seconds"] = round(time.perf_counter() - start, 1)
                runs[arm].put(f"ruler {task}", length, cell)
                record.save(out)
                shown = (results.format_rate(cell["score"], cell["n"], cell["low"], cell["high"])
                         if "score" in cell else cell.get("skipped"))
                print(f"{arm:<20} {task:<16} {length:>6}: {shown}  ({cell['seconds']} s)", flush=True)
    hf_posenc.unpatch(model)
    record.save(out, complete=True)
    write_report(record, out)


def write_report(record: results.Results, out: Path) -> None:
    """The heat-map and a Markdown table (a row per arm and task, a column per length)."""
    plots.ruler_heatmap(record.runs, out.with_suffix(".png"))
    tables = [m for m in results.METRICS if m.startswith("ruler ") and any(m in run.metrics for run in record.runs)]
    lengths = sorted({int(k) for run in record.runs for m in tables for k in run.metrics.get(m, {})})
    lines = ["| model | task | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    for run in record.runs:
        for metric in tables:
            cells = [run.metrics.get(metric, {}).get(str(n)) for n in lengths]
            shown = ["–" if c is None else results.format_rate(c["score"], c["n"], c["low"], c["high"])
                     if "score" in c else "skipped" for c in cells]
            lines.append(f"| {run.label} | {metric.removeprefix('ruler ')} | " + " | ".join(shown) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
