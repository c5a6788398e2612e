"""RULER (Hsieh et al. 2024) on SmolLM2-135M-Instruct under position swaps without training (issue 20): original
RoPE, YaRN x2 and x4, ALiBi and NoPE, through `hf-posenc eval --suite ruler`'s code (lm-eval's RULER
generators and scorer, offline, essay haystack = the KJV), each task x length with its n and 95%
Wilson interval.

One process loads the model once and patches it per arm; every cell is written to
benchmarks/results/ruler_smollm2.json (an `eval` results file: `hf-posenc eval --compare` reads it) as
it finishes, lengths in the outer loop so every arm has its short lengths before any arm gets the long
ones. Then the heat-map (ruler_smollm2.png) and the Markdown table (ruler_smollm2.md).

Cost on 2 idle cores (float32, sdpa): prefill of a 1k / 2k / 4k / 8k-token prompt takes 2.3 / 5.2 / 13.5 /
37 s, so a task x length x arm cell of 10 samples at 8k is ~7 minutes. Two rules keep the grid within a
session: answers are capped per task (GEN_TOKENS: a needle's 7-digit number is ~8 SmolLM2 tokens, vt's five
variable names ~15, cwe's ten words ~30; RULER's own caps are 30-128), and a task an arm scored 0/n at one
length is not run at the longer ones (RULER's tasks get harder with length by construction: the haystack
grows, the needle stays) -- such a cell reads "skipped" with the length that scored 0, never a rate.
The recovered arm is the model `hf-posenc train recipes/smollm2-135m/alibi/config_smoke.yaml` saved
(`--recovered DIR`).

Run: `.venv/bin/python benchmarks/ruler_smollm2.py [--tasks ... --lengths ... --samples N --arms ...]`;
`--report-only` redraws the plot and table from the JSON (of a run stopped early: cells not reached are "–").
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

import torch

import hf_posenc
from hf_posenc import plots, results
from hf_posenc.evaluation.suite import registered_tables
from hf_posenc.evaluation.ruler import HAYSTACK, ruler_scores
from hf_posenc.loading import load

OUT = Path(__file__).parent / "results" / "ruler_smollm2.json"
RECOVERED = "alibi (smoke recipe: 96 steps)"
# arm -> (scheme, options); None keeps SmolLM2's own RoPE (theta 1e5, trained to 8192 tokens)
ARMS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "original (rope)": None,
    "yarn x2": ("yarn", {"factor": 2.0}),
    "yarn x4": ("yarn", {"factor": 4.0}),
    "alibi (no training)": ("alibi", {}),
    "nope (no training)": ("nope", {}),
    RECOVERED: None,  # loaded from --recovered
}
# the greedy answer's cap per task (tokens): enough for the reference answer, far below RULER's own caps
GEN_TOKENS = {"niah_single_1": 16, "niah_single_2": 16, "niah_multikey_1": 16, "vt": 30, "cwe": 40}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="niah_single_1,niah_single_2,niah_multikey_1,vt,cwe")
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--only-at", action="append", default=[], metavar="LENGTH=TASK,...",
                        help="at LENGTH run only these tasks (the others read 'skipped: CPU budget'); repeatable")
    parser.add_argument("--recovered", default="out/smollm2-135m-alibi-smoke",
                        help="the folder the alibi smoke recipe saved (the recovered arm)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--report-only", action="store_true",
                        help="only redraw the plot and table from --out (e.g. of a run stopped at the deadline)")
    args = parser.parse_args()
    if args.report_only:
        write_report(results.load(args.out), Path(args.out))
        return
    tasks, arms = args.tasks.split(","), args.arms.split(",")
    lengths = [int(n) for n in args.lengths.split(",")]
    only_at = {int(n): set(t.split(",")) for n, t in (spec.split("=") for spec in args.only_at)}
    torch.manual_seed(0)
    model, tokenizer = load("smollm2", dtype=torch.float32)
    record = results.Results("eval", "smollm2", settings={
        "suite": ["ruler:" + ",".join(tasks)], "lengths": lengths, "samples": args.samples,
        "gen_tokens": {t: GEN_TOKENS.get(t) for t in tasks},
        "only_at": {str(n): sorted(t) for n, t in only_at.items()}, "seed": 0, "haystack": HAYSTACK, "dtype": "float32",
        "threads": torch.get_num_threads()})
    runs = {}
    for arm in arms:
        spec = ARMS[arm]
        runs[arm] = results.Run(arm, spec[0] if spec else None, dict(spec[1]) if spec else {})
        record.runs.append(runs[arm])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    zero_at: dict[tuple[str, str], int] = {}  # (arm, task) -> the length it scored 0/n at
    for length in lengths:
        for arm in arms:
            arm_model = _arm_model(arm, model, args.recovered)
            runs[arm].posenc = arm_model.config.posenc if hf_posenc.describe(arm_model) else None
            for task in tasks:
                if (arm, task) in zero_at:
                    runs[arm].put(f"ruler {task}", length, {"skipped": f"0/{args.samples} at {zero_at[arm, task]}"})
                    continue
                if task not in only_at.get(length, {task}):
                    runs[arm].put(f"ruler {task}", length, {"skipped": "CPU budget"})
                    continue
                start = time.perf_counter()
                scores = ruler_scores(arm_model, tokenizer, [task], [length], args.samples,
                                      gen_tokens=GEN_TOKENS.get(task))
                cell = scores[task][length]
                if cell.get("score") == 0:
                    zero_at[arm, task] = length
                cell["seconds"] = round(time.perf_counter() - start, 1)
                runs[arm].put(f"ruler {task}", length, cell)
                record.save(out)
                shown = (results.format_rate(cell["score"], cell["n"], cell["low"], cell["high"])
                         if "score" in cell else cell.get("skipped"))
                print(f"{arm:<20} {task:<16} {length:>6}: {shown}  ({cell['seconds']} s)", flush=True)
    record.save(out, complete=True)
    write_report(record, out)


def _arm_model(arm: str, model: torch.nn.Module, recovered: str) -> torch.nn.Module:
    """The model for `arm`: the recovered folder, or the packaged SmolLM2 re-patched in place."""
    if arm == RECOVERED:
        return _recovered(recovered)
    hf_posenc.unpatch(model)
    if ARMS[arm] is not None:
        hf_posenc.patch(model, ARMS[arm][0], **ARMS[arm][1])
    return model


@functools.cache
def _recovered(folder: str) -> torch.nn.Module:
    return hf_posenc.from_pretrained(folder, dtype=torch.float32).eval()


def write_report(record: results.Results, out: Path) -> None:
    """The heat-map and a Markdown table (a row per arm and task, a column per length)."""
    schemas = registered_tables()
    tables = {m: t for m, t in schemas.items() if m.startswith("ruler ") and any(m in run.metrics for run in record.runs)}
    plots.heatmap(record.runs, tables, out.with_suffix(".png"), next(iter(tables.values())).plot)
    lengths = sorted({int(k) for run in record.runs for m in tables for k in run.metrics.get(m, {})})
    lines = ["| model | task | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    for run in record.runs:
        for metric in tables:
            cells = [run.metrics.get(metric, {}).get(str(n)) for n in lengths]
            shown = ["–" if c is None else results.format_rate(c["score"], c["n"], c["low"], c["high"])
                     if "score" in c else f"skipped ({c['skipped']})" for c in cells]
            lines.append(f"| {run.label} | {metric.removeprefix('ruler ')} | " + " | ".join(shown) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
