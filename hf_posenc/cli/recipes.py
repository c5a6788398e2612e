"""`hf-posenc recipes`: the recipes shipped in the package, one line each; `recipes copy NAME DIR` writes an
editable copy (the YAML and its model's README) that `hf-posenc train DIR/config_<variant>.yaml` runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "List the shipped recipes (model, scheme, steps, tokens, goal), or copy one to edit."
    parser.epilog = ("examples:\n  hf-posenc recipes\n  hf-posenc recipes --json\n"
                     "  hf-posenc recipes copy smollm2-135m/alibi/smoke my-recipe\n"
                     "  hf-posenc train smollm2-135m/alibi/smoke --max_steps 20")
    parser.add_argument("action", nargs="?", choices=("list", "copy"), default="list", help="list (default) or copy")
    parser.add_argument("name", nargs="?", help="copy: the shipped recipe's name (as `hf-posenc recipes` lists it)")
    parser.add_argument("dir", nargs="?", help="copy: a new (or empty) folder for the copy")
    parser.add_argument("--json", action="store_true", help="list as JSON")


def check(args: argparse.Namespace) -> None:
    """copy needs a shipped name and a folder that holds nothing yet (exit 2 before anything is written)."""
    from ..errors import PosEncError
    from ..train.shipped import find

    if args.action == "list" and (args.name or args.dir):
        raise PosEncError("recipes takes NAME and DIR only after `copy`: hf-posenc recipes copy NAME DIR")
    if args.action == "copy":
        if not (args.name and args.dir):
            raise PosEncError("recipes copy needs NAME and DIR: hf-posenc recipes copy smollm2-135m/alibi/smoke my-recipe")
        find(args.name)
        folder = Path(args.dir)
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise PosEncError(f"DIR {folder} already exists and is not an empty folder; give a new folder")


def main(args: argparse.Namespace) -> int:
    from ..train.shipped import copy_recipe, shipped_recipes

    if args.action == "copy":
        target = copy_recipe(args.name, Path(args.dir))
        print(f"wrote {target} (and its model's README.md); run it with: hf-posenc train {target}")
        return 0
    rows = [r.summary() for r in shipped_recipes()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        cost = f"{r['steps']} steps, {r['tokens'] / 1e6:.2f}M tokens" if r["steps"] else \
            f"{r['epochs']} epoch(s)" if r["epochs"] else "no steps set"
        print(f"{r['name']:{width}s}  {r['model']} -> {r['scheme']}; {cost}. {r['goal']}")
    return 0
