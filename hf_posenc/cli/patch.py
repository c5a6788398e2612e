"""`hf-posenc patch`: load a model, patch it, save it -- without writing Python."""

from __future__ import annotations

import argparse

import torch

from ..loading import load
from ..patching import describe
from . import parse_options


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Load a model, patch its positional scheme, save it (reload with hf_posenc.from_pretrained)."
    parser.epilog = ("examples:\n  hf-posenc patch smollm2 yarn --opt factor=4 --out out/smollm2-yarn4\n"
                     "  hf-posenc patch ./my-gpt2 rope --opt theta=10000 --out ./my-gpt2-rope")
    parser.add_argument("model", help="'smollm2', a local folder or a Hub id")
    parser.add_argument("scheme", help="a scheme name (hf-posenc list)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="scheme option, repeatable")
    parser.add_argument("--out", required=True, help="folder to save the patched model and tokenizer in")


def main(args: argparse.Namespace) -> int:
    # the class the checkpoint was saved as, so a BertModel stays a BertModel
    model, tokenizer = load(args.model, task="saved", dtype=torch.float32, scheme=args.scheme,
                            options=parse_options(args.opt))
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved {describe(model)} to {args.out}")
    return 0
