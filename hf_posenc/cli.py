"""`hf-posenc` entry point. Each subcommand lives in its own module with `make_parser()` and `main()`."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module exposing `make_parser(parser: argparse.ArgumentParser)` and `main(args) -> int | None`
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "list": ("hf_posenc.commands", "schemes, architectures and the support matrix"),
    "patch": ("hf_posenc.commands", "patch a model and save it"),
    "demo": ("hf_posenc.demo", "end-to-end demo on SmolLM2-135M (offline)"),
    "eval": ("hf_posenc.evaluation", "evaluate a (patched) model: perplexity by length, passkey, sst2"),
    "inspect": ("hf_posenc.analysis", "subspace geometry, four-term attention, encoding plots"),
    "train": ("hf_posenc.train", "run a fine-tuning recipe through accelerate"),
    "card": ("hf_posenc.hub", "write a model card for a run folder"),
    "push": ("hf_posenc.hub", "upload a run folder to the Hub"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-posenc",
        description="Swap the positional encoding of a transformers model, fine-tune, evaluate, inspect and publish it.",
        epilog="examples:\n  hf-posenc list\n  hf-posenc demo\n  hf-posenc patch smollm2 yarn --opt factor=4 --out out/yarn4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sp = sub.add_parser(name, help=help_text, formatter_class=argparse.RawDescriptionHelpFormatter)
        getattr(module, f"make_parser_{name}", getattr(module, "make_parser", None))(sp)
        sp.set_defaults(_main=getattr(module, f"main_{name}", getattr(module, "main", None)))
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import PosEncError

    args = build_parser().parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except PosEncError as err:
        print(f"hf-posenc {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
