"""`hf-posenc list`: schemes, architectures and which cells of the support matrix work.

Read from `hf_posenc/support.json`, the catalog's snapshot (`catalog.snapshot()`; a test keeps it
equal to the live registry), so that `list` starts without importing torch. Model types without a
hand-written adapter come from `hf_posenc/model_types.json`: the generic adapter's verdict for every
causal-LM type of the transformers version named there, each *yes* checked on a tiny model by the zoo
sweep (`benchmarks/zoo_catalog.py` writes it, tests/test_zoo.py keeps it equal to what the code does).
"""

from __future__ import annotations

import argparse
import json
import re

SITES = ("input", "qk", "score", "none")


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Schemes, architectures and which cells of the matrix work."
    parser.epilog = ("examples:\n  hf-posenc list\n  hf-posenc list --wide\n  hf-posenc list --model-types\n"
                     "  hf-posenc list --json\n  hf-posenc list --scheme yarn")
    parser.add_argument("--json", action="store_true", help="print the matrix and the model types as JSON")
    parser.add_argument("--wide", action="store_true",
                        help="print the full matrix, one column per scheme (wider than most terminals)")
    parser.add_argument("--model-types", action="store_true",
                        help="print every causal-LM and encoder-decoder model type: supported sites, or why not")
    parser.add_argument("--scheme", metavar="NAME",
                        help="print the scheme's options: type, default, allowed values (domain) and help")


def check(args: argparse.Namespace) -> None:
    """An unknown --scheme is a usage error (exit 2)."""
    if args.scheme:
        from ..config import scheme_name

        scheme_name(args.scheme)


def main(args: argparse.Namespace) -> int:
    from ..paths import MODEL_TYPES, SEQ2SEQ_TYPES, SNAPSHOT

    if args.scheme:
        return print_options(args.scheme, args.json)
    snapshot = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    model_types = json.loads(MODEL_TYPES.read_text(encoding="utf-8"))
    seq2seq_types = json.loads(SEQ2SEQ_TYPES.read_text(encoding="utf-8"))
    matrix = snapshot["matrix"]
    if args.json:
        print(json.dumps({"architectures": snapshot["architectures"], "matrix": matrix,
                          "model_types": model_types, "seq2seq_types": seq2seq_types}, indent=2))
        return 0
    if args.model_types:
        print(f"| model type | status | native | {' | '.join(SITES)} | why not |")
        print("|---" * (len(SITES) + 4) + "|")
        for name, row in model_types["types"].items():
            marks = " | ".join("yes" if row["sites"].get(s) else "-" for s in SITES)
            print(f"| {name} | {row['status']} | {row['native']} | {marks} | {row['why']} |")
        print(f"\n| encoder-decoder model type | status | stacks | native | {' | '.join(SITES)} | why not |")
        print("|---" * (len(SITES) + 5) + "|")
        for name, row in seq2seq_types["types"].items():
            marks = " | ".join("yes" if row["sites"].get(s) else "-" for s in SITES)
            print(f"| {name} | {row['status']} | {'+'.join(row['stacks'])} | {row['native']} | {marks} | {row['why']} |")
        return 0
    (print_wide if args.wide else print_compact)(snapshot)
    counts: dict[str, int] = {}
    for row in model_types["types"].values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print(f"\ncausal-LM types (transformers {model_types['transformers']}, zoo sweep): "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    counts = {}
    for row in seq2seq_types["types"].values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print(f"encoder-decoder types (transformers {seq2seq_types['transformers']}, seq2seq sweep): "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    print("`hf-posenc list --model-types` shows each model type")
    return 0


def print_wide(snapshot: dict) -> None:
    """The matrix with one column per scheme, then each scheme's site and source (what docs/hooks.py reads)."""
    schemes, matrix = sorted(snapshot["schemes"]), snapshot["matrix"]
    print("| adapter | " + " | ".join(schemes) + " |")
    print("|---" * (len(schemes) + 1) + "|")
    for adapter, row in matrix.items():
        print(f"| {adapter} | " + " | ".join("yes" if row[s] else "-" for s in schemes) + " |")
    print()
    for name in schemes:
        site, citation = snapshot["schemes"][name]
        print(f"{name:11s} {site:6s} {citation}")


def print_compact(snapshot: dict) -> None:
    """One line per scheme, narrow enough for a terminal: its site, which hand-written families take it, its
    source (authors and year); `--wide` prints the matrix itself."""
    matrix = snapshot["matrix"]
    print(f"{'scheme':11s} {'site':9s} {'families (of ' + str(len(matrix)) + ')':36s} source")
    for name in sorted(snapshot["schemes"]):
        site, citation = snapshot["schemes"][name]
        refused = [adapter for adapter, row in matrix.items() if not row[name]]
        families = "all" if not refused else f"all but {', '.join(refused)}" if len(refused) < len(matrix) else "none"
        print(f"{name:11s} {site:9s} {families:36s} {re.split(', |; ', citation)[0]}")
    print("\n`hf-posenc list --wide`: the matrix, one column per scheme; `--scheme NAME`: its options")


def print_options(scheme: str, as_json: bool) -> int:
    """One row per option of `scheme`, from its declaration (torch-free: the snapshot in support.json)."""
    from ..config import option_table

    rows = option_table(scheme)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"options of {scheme!r} (`--opt NAME=VALUE`):" if rows else f"{scheme!r} takes no options")
    if rows:
        print("| option | type | default | allowed | help |")
        print("|---|---|---|---|---|")
        for row in rows:
            source = f" ({row['source']})" if row["source"] else ""
            print(f"| {row['option']} | {row['type']} | {row['default']!r} | {row['domain']}{source} | {row['help']} |")
    return 0
