"""`hf-posenc patch`: load a model, patch it, save it -- without writing Python."""

from __future__ import annotations

import argparse

from ..folders import check_out, writing
from ..models import display_name
from ..progress import status, waiting
from .arguments import layer_list, parse_options, scheme_config
from .checks import check_model_takes, layers_fit, model_folder, options_fit


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Load a model, patch its positional scheme, save it. The folder loads back patched with "
                          "hf_posenc.from_pretrained, or AutoModel*.from_pretrained(DIR, trust_remote_code=True).")
    parser.epilog = ("examples:\n  hf-posenc patch smollm2 yarn --opt factor=4 --out out/smollm2-yarn4\n"
                     "  hf-posenc patch ./my-gpt2 rope --opt theta=10000 --out ./my-gpt2-rope\n"
                     "  hf-posenc patch smollm2 nope --layers 3,7,11,15,19,23,27 --out out/smollm2-nope-every4")
    parser.add_argument("model", help="'smollm2', a local folder or a Hub id")
    parser.add_argument("scheme", help="a scheme name (hf-posenc list)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="scheme option, repeatable")
    parser.add_argument("--layers", metavar="I,J,...", help="only these attention layers (from 0) take the scheme; "
                        "the others keep the model's own positions")
    parser.add_argument("--out", required=True, help="new folder to save the patched model and tokenizer in")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds earlier hf-posenc output")


def check(args: argparse.Namespace) -> None:
    """The folders, the scheme and its options, --layers against the config's depth (all torch-free), then
    the model's files and what its config.json says the architecture takes."""
    check_out(args.out, args.overwrite, sources={"MODEL": args.model}, command="patch")
    args.config = scheme_config(args.scheme, parse_options(args.opt), args.layers)
    if args.layers is not None:
        layers_fit(args.model, layer_list(args.layers), "--layers")
    options_fit(args.model, args.config)
    model_folder(args.model, "MODEL")
    check_model_takes(args.model, args.config)


def main(args: argparse.Namespace) -> int:
    with waiting("patch: importing torch and transformers"):
        import torch

        from ..loading import load
        from ..patching import describe, patch

    with waiting(f"loading {display_name(args.model)}"):  # the class it was saved as: a BertModel stays one
        model, tokenizer = load(args.model, task="saved", dtype=torch.float32)
    patch(model, args.config)
    from ..hub import model_card
    from ..models import origin

    status(f"saving the patched model to {args.out}")
    with writing(args.out, "patch", [args.model]) as out:  # a failure below leaves no folder
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        (out / "README.md").write_text(str(model_card(out, origin(args.model)[0])), encoding="utf-8")
    print(f"saved {describe(model)} and its model card to {args.out}")
    return 0
