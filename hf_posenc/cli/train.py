"""`hf-posenc train` (and `python -m hf_posenc.train`): run a recipe in this process, or launch it
through `accelerate launch` with a shipped or given accelerate config."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import socket
import sys
from pathlib import Path

import yaml

from ..errors import PosEncError
from ..train import load_recipe, preflight, train
from ..train.recipe import SECTIONS

EPILOG = """examples:
  hf-posenc train recipes/smollm2-135m/alibi/config_smoke.yaml --training.max_steps 20
  hf-posenc train recipes/minilm-l6/rope/config_smoke.yaml --accelerate-config cpu_2proc
  hf-posenc train recipes/smollm2-135m/yarn/config_4x.yaml --resume
  accelerate launch --config_file CFG -m hf_posenc.train RECIPE.yaml --lr 5e-4

any recipe field is overridden by --section.field VALUE (or --field VALUE when one section has it;
lists as --peft.target_modules q_proj v_proj, mappings as YAML: --posenc.options '{factor: 8}'):
"""


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
    parser.description = "Swap a model's positional scheme and recover it with accelerate + peft, as a recipe says."
    fields = (f"  {section}: {', '.join(f.name for f in dataclasses.fields(cls))}" for section, cls in SECTIONS.items())
    parser.epilog = EPILOG + "\n".join(fields)
    parser.add_argument("recipe", help="recipe YAML (see recipes/)")
    parser.add_argument("--accelerate-config", dest="accelerate_config", default=None,
                        help="launch through `accelerate launch` with this config (name or path)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in output.dir")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in output.dir")
    parser.set_defaults(overrides=[])  # the recipe-field options the dispatcher does not know


def _free_port() -> int:
    """torchrun's default port 29500 may be held by another job on a shared machine: its workers would wait forever."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(path: Path, module_argv: list[str], prog: str) -> int:
    """`accelerate launch --config_file PATH -m MODULE_ARGV...`: the processes the config asks for,
    each running `python -m MODULE_ARGV...`."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    config = yaml.safe_load(path.read_text()) or {}
    if config.get("use_cpu"):
        os.environ["ACCELERATE_USE_CPU"] = "true"  # torchrun children do not get it from the config
    port = [] if config.get("main_process_port") else ["--main_process_port", str(_free_port())]
    launch_args = launch_command_parser().parse_args(["--config_file", str(path), *port, "-m", *module_argv])
    try:
        launch_command(launch_args)
    except Exception as err:  # the children printed their own tracebacks
        print(f"{prog}: launch failed: {type(err).__name__}", file=sys.stderr)
        return 1
    return 0


def main(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe, args.overrides)
    if args.accelerate_config is None:
        train(recipe, resume=args.resume, overwrite=args.overwrite)
        return 0
    path = accelerate_config(args.accelerate_config)
    config = yaml.safe_load(path.read_text()) or {}
    preflight(recipe, args.resume, args.overwrite, int(config.get("num_processes", 1)))  # fail here, not in N children
    flags = [f"--{name}" for name in ("resume", "overwrite") if getattr(args, name)]
    return launch(path, ["hf_posenc.train", args.recipe, *args.overrides, *flags], "hf-posenc train")
