"""Fine-tuning recipes: swap a model's positional scheme, then recover it with accelerate + peft.

The same code runs under every launcher:

    accelerate launch --config_file CFG -m hf_posenc.train RECIPE.yaml [--section.field value ...]
    python -m hf_posenc.train RECIPE.yaml                       # one process
    hf-posenc train RECIPE.yaml --accelerate-config cpu_2proc   # a shipped config, by name

Examples:
    hf-posenc train recipes/smollm2-135m/alibi/config_smoke.yaml --training.max_steps 20
    hf-posenc train recipes/minilm-l6/rope/config_smoke.yaml --accelerate-config cpu_2proc
    hf-posenc train recipes/smollm2-135m/yarn/config_4x.yaml --resume
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import socket
import sys
from pathlib import Path

import yaml

from ..errors import PosEncError
from .recipe import Recipe, load_recipe
from .runner import preflight, train

__all__ = ["Recipe", "accelerate_config", "load_recipe", "main", "make_parser", "train"]

FLAGS = ("--resume", "--overwrite")


def accelerate_config(name: str) -> Path:
    """A shipped accelerate config by name (ddp, fsdp, deepspeed_zero2, cpu, cpu_2proc), or a path."""
    if Path(name).is_file():
        return Path(name)
    folder = importlib.resources.files("hf_posenc") / "accelerate_configs"
    path = Path(str(folder / f"{name}.yaml"))
    if not path.is_file():
        names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
        raise PosEncError(f"accelerate config {name!r} not found; shipped: {', '.join(names)}, or give a path")
    return path


def make_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("recipe", help="recipe YAML (see recipes/)")
    parser.add_argument("overrides", nargs=argparse.REMAINDER,
                        help="--section.field value (or --field value) pairs that override the recipe")
    parser.add_argument("--accelerate-config", dest="accelerate_config", default=None,
                        help="launch through `accelerate launch` with this config (name or path)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in output.dir")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in output.dir")


def _split_flags(args: argparse.Namespace) -> list[str]:
    """Our own flags may also come after the recipe, where REMAINDER swallowed them."""
    rest, i = [], 0
    while i < len(args.overrides):
        item = args.overrides[i]
        if item in FLAGS:
            setattr(args, item[2:], True)
        elif item in ("--accelerate-config", "--accelerate_config") and i + 1 < len(args.overrides):
            args.accelerate_config, i = args.overrides[i + 1], i + 1
        else:
            rest.append(item)
        i += 1
    return rest


def _free_port() -> int:
    """torchrun's default port 29500 may be held by another job on a shared machine: its workers would wait forever."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(args: argparse.Namespace) -> int:
    overrides = _split_flags(args)
    recipe = load_recipe(args.recipe, overrides)
    if args.accelerate_config is None:
        train(recipe, resume=args.resume, overwrite=args.overwrite)
        return 0
    path = accelerate_config(args.accelerate_config)
    config = yaml.safe_load(path.read_text()) or {}
    preflight(recipe, args.resume, args.overwrite, int(config.get("num_processes", 1)))  # fail here, not in N children
    from accelerate.commands.launch import launch_command, launch_command_parser

    if config.get("use_cpu"):
        os.environ["ACCELERATE_USE_CPU"] = "true"  # torchrun children do not get it from the config
    flags = [f for f in FLAGS if getattr(args, f[2:])]
    port = [] if config.get("main_process_port") else ["--main_process_port", str(_free_port())]
    launch_args = launch_command_parser().parse_args(
        ["--config_file", str(path), *port, "-m", "hf_posenc.train", args.recipe, *overrides, *flags])
    try:
        launch_command(launch_args)
    except Exception as err:  # the children printed their own tracebacks
        print(f"hf-posenc train: launch failed: {type(err).__name__}", file=sys.stderr)
        return 1
    return 0


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m hf_posenc.train` (what `accelerate launch -m` runs in each process)."""
    parser = argparse.ArgumentParser(prog="python -m hf_posenc.train")
    make_parser(parser)
    args = parser.parse_args(argv)
    try:
        return main(args)
    except PosEncError as err:
        print(f"hf_posenc.train: error: {err}", file=sys.stderr)
        return 2
