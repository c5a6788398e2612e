"""`hf-posenc list`: schemes, architectures and which cells of the support matrix work."""

from __future__ import annotations

import argparse
import json

from ..registry import get_scheme, list_architectures, support_matrix


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Schemes, architectures and which cells of the matrix work."
    parser.epilog = "examples:\n  hf-posenc list\n  hf-posenc list --json"
    parser.add_argument("--json", action="store_true", help="print the matrix as JSON")


def main(args: argparse.Namespace) -> int:
    matrix = support_matrix()
    if args.json:
        print(json.dumps({"architectures": list_architectures(), "matrix": matrix}, indent=2))
        return 0
    schemes = sorted(next(iter(matrix.values())))
    print("| adapter | " + " | ".join(schemes) + " |")
    print("|---" * (len(schemes) + 1) + "|")
    for adapter, row in matrix.items():
        print(f"| {adapter} | " + " | ".join("yes" if row[s] else "-" for s in schemes) + " |")
    print()
    for name in schemes:
        scheme = get_scheme(name)
        print(f"{name:11s} {scheme.site:6s} {scheme.citation}")
    return 0
