"""`hf-posenc list`: schemes, architectures and which cells of the support matrix work.

Read from `hf_posenc/support.json`, the registry's snapshot (`registry.snapshot()`; a test keeps it
equal to the live registry), so that `list` starts without importing torch.
"""

from __future__ import annotations

import argparse
import json


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Schemes, architectures and which cells of the matrix work."
    parser.epilog = "examples:\n  hf-posenc list\n  hf-posenc list --json"
    parser.add_argument("--json", action="store_true", help="print the matrix as JSON")


def main(args: argparse.Namespace) -> int:
    from ..registry import SNAPSHOT

    snapshot = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    matrix = snapshot["matrix"]
    if args.json:
        print(json.dumps({"architectures": snapshot["architectures"], "matrix": matrix}, indent=2))
        return 0
    schemes = sorted(snapshot["schemes"])
    print("| adapter | " + " | ".join(schemes) + " |")
    print("|---" * (len(schemes) + 1) + "|")
    for adapter, row in matrix.items():
        print(f"| {adapter} | " + " | ".join("yes" if row[s] else "-" for s in schemes) + " |")
    print()
    for name in schemes:
        site, citation = snapshot["schemes"][name]
        print(f"{name:11s} {site:6s} {citation}")
    return 0
