"""`hf-posenc card`: write a model card for a model, training run or evaluation folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import PosEncError
from .checks import repo_id
from .suite_flags import import_suite_modules


def prepare(argv: list[str] | None) -> None:
    """The suites of your own whose tables the folder's results hold (their model-index entries, plots)."""
    import_suite_modules(argv)


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write DIR/README.md (replacing it if present): a model card with the positional scheme, "
                          "how to load it, the training recipe, results (as model-index metadata too) and the "
                          "plots in DIR.")
    parser.epilog = ("examples:\n"
                     "  hf-posenc card out/smollm2-yarn4 --base-model HuggingFaceTB/SmolLM2-135M-Instruct\n"
                     "  hf-posenc card runs/minilm-rope --repo-id me/minilm-l6-rope")
    parser.add_argument("dir", metavar="DIR",
                        help="a saved model, `hf-posenc train` run or `hf-posenc eval` output folder")
    parser.add_argument("--base-model", help="Hub id of the model it derives from")
    parser.add_argument("--repo-id", help="Hub repo the card is for (used in the loading example)")
    parser.add_argument("--suite-module", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="import a suite of your own first, as `eval --suite-module` does (repeatable)")


def check(args: argparse.Namespace) -> None:
    if not Path(args.dir).is_dir():
        raise PosEncError(f"DIR {args.dir} is not a folder; give a model, run or eval output folder")
    repo_id(args.repo_id, "--repo-id")
    repo_id(args.base_model, "--base-model")


def main(args: argparse.Namespace) -> int:
    from ..hub import model_card

    card = model_card(args.dir, args.base_model, repo_id=args.repo_id)
    path = Path(args.dir) / "README.md"
    path.write_text(str(card), encoding="utf-8")
    print(f"wrote {path}")
    return 0
