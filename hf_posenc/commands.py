"""`hf-posenc list` and `hf-posenc patch`: the support matrix, and patch-and-save without Python."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .registry import get_scheme, list_architectures, support_matrix


def make_parser_list(parser: argparse.ArgumentParser) -> None:
    parser.description = "Schemes, architectures and which cells of the matrix work."
    parser.epilog = "examples:\n  hf-posenc list\n  hf-posenc list --json"
    parser.add_argument("--json", action="store_true", help="print the matrix as JSON")


def main_list(args: argparse.Namespace) -> int:
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


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """`k=v` strings to options; values are read as JSON where they parse (numbers, lists, null)."""
    from .errors import PosEncError

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PosEncError(f"--opt takes key=value, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def make_parser_patch(parser: argparse.ArgumentParser) -> None:
    parser.description = "Load a model, patch its positional scheme, save it (reload with hf_posenc.from_pretrained)."
    parser.epilog = ("examples:\n  hf-posenc patch smollm2 yarn --opt factor=4 --out out/smollm2-yarn4\n"
                     "  hf-posenc patch ./my-gpt2 rope --opt theta=10000 --out ./my-gpt2-rope")
    parser.add_argument("model", help="'smollm2', a local folder or a Hub id")
    parser.add_argument("scheme", help="a scheme name (hf-posenc list)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="scheme option, repeatable")
    parser.add_argument("--out", required=True, help="folder to save the patched model and tokenizer in")


def main_patch(args: argparse.Namespace) -> int:
    from .evaluation import load_model
    from .patching import describe

    model, tokenizer = load_model(args.model, scheme=args.scheme, options=parse_options(args.opt))
    if getattr(model.config, "quantization_config", None) is not None:
        # GGUF-loaded weights are already dequantized; the marker only blocks save_pretrained.
        del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved {describe(model)} to {args.out}")
    return 0
