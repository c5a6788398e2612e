"""`hf-posenc`: the dispatcher. Each subcommand is a module here with `make_parser(parser)` and
`main(args) -> int`; feature modules expose plain functions and parse no argv."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from ..errors import PosEncError

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "list": ("hf_posenc.cli.list_", "schemes, architectures and the support matrix"),
    "patch": ("hf_posenc.cli.patch", "patch a model and save it"),
    "demo": ("hf_posenc.cli.demo", "end-to-end demo on SmolLM2-135M (offline)"),
    "eval": ("hf_posenc.cli.eval_", "evaluate a (patched) model: perplexity by length, passkey, sentiment"),
    "inspect": ("hf_posenc.cli.inspect", "subspace geometry, four-term attention, encoding plots"),
    "train": ("hf_posenc.cli.train", "run a fine-tuning recipe through accelerate"),
    "card": ("hf_posenc.cli.card", "write a model card for a run folder"),
    "push": ("hf_posenc.cli.push", "upload a run folder to the Hub"),
}


def _add(parser: argparse.ArgumentParser, command: str) -> None:
    module = importlib.import_module(SUBCOMMANDS[command][0])
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    module.make_parser(parser)
    parser.set_defaults(_main=module.main, _prog=parser.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-posenc",
        description="Swap the positional encoding of a transformers model, fine-tune, evaluate, inspect and publish it.",
        epilog="examples:\n  hf-posenc list\n  hf-posenc demo\n  hf-posenc patch smollm2 yarn --opt factor=4 --out out/yarn4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        _add(sub.add_parser(name, help=help_text), name)
    return parser


def _run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse, run, and turn a PosEncError into `prog: error: ...` and exit code 2. Arguments the parser
    does not know are a train recipe's field overrides, for commands that take them."""
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "overrides"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = extra
    try:
        return int(args._main(args) or 0)
    except PosEncError as err:
        print(f"{args._prog}: error: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of `hf-posenc`."""
    return _run(build_parser(), argv)


def run_alone(command: str, argv: list[str] | None = None) -> int:
    """One subcommand as its own program: `python -m hf_posenc.train` (what `accelerate launch -m`
    runs in each process) is `hf-posenc train`."""
    parser = argparse.ArgumentParser(prog=f"python -m hf_posenc.{command}")
    _add(parser, command)
    return _run(parser, argv)


# ---------------------------------------------------------------- argument types shared by subcommands


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """`k=v` strings to scheme options; values are read as JSON where they parse (numbers, lists, null)."""
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


def int_list(text: str, what: str) -> list[int]:
    """'512,1024' -> [512, 1024]; each must be a positive integer."""
    from ..evaluation.scoring import check_lengths

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise PosEncError(f"{what}s must be comma-separated integers, got {text!r}") from err
    return check_lengths(values, what)


def float_list(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise PosEncError(f"{what}s must be comma-separated numbers, got {text!r}") from err
