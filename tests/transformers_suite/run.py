"""Run transformers' own model tests stock and on hf-posenc-patched models, and list what patched breaks (issue 37).

    .venv/bin/python tests/transformers_suite/run.py                          # the whole plan
    .venv/bin/python tests/transformers_suite/run.py --family llama --cell alibi --cell nope

Per family: one stock run (the union of the chosen cells' selections) and one patched run holding every chosen
cell (one process start-up for all of them), each with `--junitxml`, then a per-test comparison. Writes
out/transformers-suite/findings.json (and the junit files beside it) and prints one row per cell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: `transformers_suite` from tests/

from transformers_suite import junit, plan, tree  # noqa: E402

OUT = tree.ROOT / "out" / "transformers-suite"
# Findings measured and not fixed yet (not departures: the list only shrinks); tests/test_transformers_suites.py
# fails a cell on any finding not listed here
OPEN_FINDINGS = Path(__file__).parent / "open_findings.json"


def chosen(family: str, labels: list[str] | None) -> list[dict[str, Any]]:
    """The family's cells, or those `labels` name (an unknown label is an error, not an empty run)."""
    cells = plan.cells(family)
    if not labels:
        return cells
    unknown = sorted(set(labels) - {cell["label"] for cell in cells})
    if unknown:
        raise SystemExit(f"no cell {', '.join(unknown)} in {family}; cells: {', '.join(c['label'] for c in cells)}")
    return [cell for cell in cells if cell["label"] in labels]


def run_family(family: str, labels: list[str] | None = None, jobs: int = 2, out: Path = OUT) -> dict[str, Any]:
    """Stock and patched runs of one family's chosen cells in one session, compared test by test."""
    where, _ = tree.build()
    cells = chosen(family, labels)
    stock = tree.pytest_run(where, plan.FILES[family], [plan.stock_cell(cells)], out / f"{family}-stock.xml", jobs)
    patched = tree.pytest_run(where, plan.FILES[family], cells, out / f"{family}-patched.xml", jobs)
    seconds = {"stock": round(stock.seconds, 1), "stock_cpu": round(stock.cpu_seconds, 1),
               "patched": round(patched.seconds, 1), "patched_cpu": round(patched.cpu_seconds, 1)}
    return {"family": family, "seconds": seconds, **compared(family, cells, out)}


def compared(family: str, cells: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """The stock summary and each cell's comparison, from the family's two junit files in `out`."""
    stock_cases = junit.read(out / f"{family}-stock.xml")
    patched_cases = junit.read(out / f"{family}-patched.xml")
    return {"stock": {"ran": len(stock_cases),
                      "passed": sum(c.outcome == "passed" for c in stock_cases.values()),
                      "failed": sorted(t for (t, _), c in stock_cases.items() if c.outcome == "failed")},
            "cells": {c["label"]: {"patch": c["patch"], "whole_file": c["select"] == plan.ALL,
                                   **junit.compare(stock_cases, patched_cases, c["label"])} for c in cells}}


def causes(cell: dict[str, Any], width: int = 140) -> list[str]:
    """A cell's findings grouped by cause: count, first error line, two example tests, where the first failed."""
    return [f"{len(group['tests']):>3} x {group['first_line'][:width]}  "
            f"[{', '.join(t['test'].partition('::')[2] for t in group['tests'][:2])}]\n"
            f"        at {group['tests'][0]['where'][:width + 60]}" for group in cell["causes"]]


def table(results: list[dict[str, Any]]) -> str:
    """One line per cell: findings, documented departures, patched passes, and the causes' first lines."""
    lines = ["family  cell            tests findings departures passed(patched/unpatched) skipped"]
    for result in results:
        for label, cell in result["cells"].items():
            lines.append(f"{result['family']:<7} {label:<15} {cell['ran']:>5} {cell['findings']:>8} "
                         f"{cell['departures']:>10} {cell['passed_patched']:>8}/{cell['passed_unpatched']:<8} "
                         f"{cell['skipped']:>12}")
            lines += [f"        {line}" for line in causes(cell)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", action="append", choices=sorted(plan.FILES), help="default: all four")
    parser.add_argument("--cell", action="append", help="a cell label of the family (default: all its cells)")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers per run (0: in-process)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--reread", action="store_true", help="compare the junit files already in --out, run nothing")
    parser.add_argument("--write-open", action="store_true",
                        help=f"after --reread: make {OPEN_FINDINGS.name} the findings of --out (all four families)")
    args = parser.parse_args(argv)
    if args.reread:
        status = reread(args.family or list(plan.FILES), args.cell, args.out)
        if args.write_open:
            write_open(json.loads((args.out / "findings.json").read_text(encoding="utf-8"))["results"])
        return status
    start = time.monotonic()
    _, setup_seconds = tree.build()
    results = [run_family(family, args.cell, args.jobs, args.out) for family in args.family or list(plan.FILES)]
    report = {"setup_seconds": round(setup_seconds, 1), "total_seconds": round(time.monotonic() - start, 1),
              "jobs": args.jobs, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "findings.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(table(results))
    print(f"setup {setup_seconds:.1f} s, total {report['total_seconds']:.1f} s; {args.out / 'findings.json'}")
    return 1 if any(cell["findings"] for r in results for cell in r["cells"].values()) else 0


def write_open(results: list[dict[str, Any]]) -> None:
    """open_findings.json from a run of every family: the tests each cell still fails (issue 37's open list)."""
    if {result["family"] for result in results} != set(plan.FILES):
        raise SystemExit(f"--write-open needs a run of every family ({', '.join(plan.FILES)})")
    cells = {f"{result['family']}/{label}": sorted(t["test"] for cause in cell["causes"] for t in cause["tests"])
             for result in results for label, cell in result["cells"].items() if cell["causes"]}
    listed = json.loads(OPEN_FINDINGS.read_text(encoding="utf-8"))
    OPEN_FINDINGS.write_text(json.dumps({"about": listed["about"], "cells": cells}, indent=1) + "\n", encoding="utf-8")


def reread(families: list[str], labels: list[str] | None, out: Path) -> int:
    """The table and findings.json again from the junit files of an earlier run (its times kept)."""
    saved = out / "findings.json"
    report = json.loads(saved.read_text(encoding="utf-8")) if saved.is_file() else {"results": []}
    seconds = {result["family"]: result.get("seconds") for result in report["results"]}
    report["results"] = [{"family": f, "seconds": seconds.get(f), **compared(f, chosen(f, labels), out)}
                         for f in families if (out / f"{f}-patched.xml").is_file()]
    (out / "findings.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(table(report["results"]))
    return 1 if any(cell["findings"] for r in report["results"] for cell in r["cells"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
