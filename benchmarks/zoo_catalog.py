"""The zoo catalog: every causal-LM model type of the installed transformers, built tiny, its
position structure as read by the generic adapter's discovery, the adapter's verdict (supported
schemes, or why not) and the outcome of every zoo cell.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/zoo_catalog.py [model_type ...]

writes benchmarks/results/zoo_catalog.json, the table zoo_support.md and hf_posenc/model_types.json (what
`hf-posenc list` prints); tests/test_zoo.py checks they are still what the code does.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
OUT = ROOT / "benchmarks" / "results" / "zoo_catalog.json"
TABLE = ROOT / "benchmarks" / "results" / "zoo_support.md"
MODEL_TYPES = ROOT / "hf_posenc" / "model_types.json"  # what `hf-posenc list` prints

import torch  # noqa: E402
import transformers  # noqa: E402
import zoo  # noqa: E402

import hf_posenc as hp  # noqa: E402
from hf_posenc.adapters.discover import discover  # noqa: E402


def entry(model_type: str) -> dict[str, Any]:
    built, model = zoo.cached(model_type)
    row: dict[str, Any] = {"builds": built.built, "forward": built.forward, "build_s": round(built.build_s, 3),
                           "forward_s": round(built.forward_s, 3), "error": built.error}
    if not built.forward:
        return row
    try:
        row["structure"] = discover(model).to_dict()
    except hp.PosEncError as exc:
        row["structure"] = None
        row["refused"] = str(exc)
        return row
    row.update(zoo.verdict(model))
    if "refused" in row:
        return row
    row["cells"] = {}
    for name, check in zoo.cells(model).items():
        start = time.perf_counter()
        row["cells"][name] = {"outcome": zoo.run(check, model_type), "seconds": round(time.perf_counter() - start, 3)}
    return row


def main() -> None:
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    types = [a for a in sys.argv[1:] if not a.startswith("-")] or zoo.model_types()
    catalog = json.loads(OUT.read_text()) if OUT.exists() and sys.argv[1:] else {}
    start = time.perf_counter()
    for model_type in types:
        catalog[model_type] = entry(model_type)
        cells = catalog[model_type].get("cells", {})
        failed = [c for c, r in cells.items() if r["outcome"].startswith("fail")]
        print(f"{model_type:26s} {zoo.status(catalog[model_type]):8s} cells {len(cells) - len(failed)}/{len(cells)}"
              f"{'  failed: ' + ', '.join(failed) if failed else ''}", flush=True)
    catalog = dict(sorted(catalog.items()))
    OUT.write_text(json.dumps(catalog, indent=1, default=str) + "\n")
    TABLE.write_text(zoo.table(catalog))
    MODEL_TYPES.write_text(json.dumps(zoo.shipped(catalog), indent=1) + "\n")
    summary = zoo.summary(catalog)
    print(json.dumps(summary["counts"], indent=1), f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
