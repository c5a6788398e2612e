"""`hf-posenc train` (and `python -m hf_posenc.train`): run a recipe in this process, or launch it
through `accelerate launch` with a shipped or given accelerate config."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import os
import socket
from pathlib import Path
from typing import Any

from ..errors import PosEncError
from .checks import model_folder

EPILOG = """examples:
  hf-posenc train recipes/smollm2-135m/alibi/config_smoke.yaml --training.max_steps 20
  hf-posenc train recipes/minilm-l6/rope/config_smoke.yaml --accelerate-config cpu_2proc
  hf-posenc train recipes/smollm2-135m/yarn/config_4x.yaml --resume
  hf-posenc train recipes/smollm2-135m/yarn/config_4x.yaml --resume auto   # continue if a checkpoint exists
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
    from ..train.recipe import SECTIONS

    parser.description = "Swap a model's positional scheme and recover it with accelerate + peft, as a recipe says."
    fields = (f"  {section}: {', '.join(f.name for f in dataclasses.fields(cls))}" for section, cls in SECTIONS.items())
    parser.epilog = EPILOG + "\n".join(fields)
    parser.add_argument("recipe", help="recipe YAML (see recipes/)")
    parser.add_argument("--accelerate-config", dest="accelerate_config", default=None,
                        help="launch through `accelerate launch` with this config (name or path)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, choices=["auto"], metavar="auto",
                        help="continue from the latest checkpoint in output.dir (an error if there is none); "
                             "`--resume auto`: continue if there is one, else start")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in output.dir")
    parser.set_defaults(overrides=[])  # the recipe-field options the dispatcher does not know


def _free_port() -> int:
    """torchrun's default port 29500 may be held by another job on a shared machine: its workers would wait forever."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check(args: argparse.Namespace) -> None:
    """The recipe, the batch split over the processes, the output folder, the scheme and the data."""
    from ..train import load_recipe

    args.recipe_obj = recipe = load_recipe(args.recipe, args.overrides)  # torch-free: refused at once
    model_folder(recipe.model.name_or_path, f"{recipe.source}: model.name_or_path")
    args.config_path, args.launch = None, {}
    if args.accelerate_config is not None:
        args.config_path = accelerate_config(args.accelerate_config)
        args.launch = launch_settings(args.config_path)
    world = args.launch.get("num_processes", 1) if args.config_path else 1
    from ..train import preflight

    preflight(args.recipe_obj, args.resume, args.overwrite, world)  # fail here, not in N children


def launch_settings(path: Path) -> dict[str, Any]:
    """An accelerate config file as a mapping, its process count a positive integer."""
    from ..train.recipe import read_yaml

    config = read_yaml(path, "accelerate config") or {}
    processes = config.get("num_processes", 1) if isinstance(config, dict) else None
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        raise PosEncError(f"{path}: an accelerate config is a YAML mapping whose num_processes is an integer >= 1 "
                          f"(see `accelerate config`), got {config!r:.80}")
    return config


def main(args: argparse.Namespace) -> int:
    if args.config_path is None:
        from ..train import train

        from accelerate import PartialState

        record = train(args.recipe_obj, resume=args.resume, overwrite=args.overwrite)
        if PartialState().is_main_process:  # under `accelerate launch`, rank 0 speaks for all
            print(summary(record, args.recipe_obj.output.dir))
        return 0
    flags = ["--overwrite"] if args.overwrite else []
    flags += ["--resume", *(["auto"] if args.resume == "auto" else [])] if args.resume else []
    return launch(args.config_path, args.launch, ["hf_posenc.train", args.recipe, *args.overrides, *flags], "training")


def launch(path: Path, config: dict[str, Any], module_argv: list[str], what: str) -> int:
    """`accelerate launch --config_file PATH -m MODULE_ARGV...`: the processes the config asks for,
    each running `python -m MODULE_ARGV...` (train and eval share it)."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    if config.get("use_cpu"):
        os.environ["ACCELERATE_USE_CPU"] = "true"  # torchrun children do not get it from the config
    port = [] if config.get("main_process_port") else ["--main_process_port", str(_free_port())]
    launch_args = launch_command_parser().parse_args(["--config_file", str(path), *port, "-m", *module_argv])
    try:
        launch_command(launch_args)
    except Exception as err:  # the children printed their own tracebacks
        raise PosEncError(f"the {config.get('num_processes', 1)} {what} processes failed ({type(err).__name__}); "
                          "their messages are above") from None
    return 0


def summary(record: Any, out: str) -> str:
    """What a finished run did: steps, last logged loss, held-out perplexity, where the model is."""
    from .. import results

    details = record.details
    lines = [f"trained {details.get('steps')} steps on {details.get('world_size')} process(es) "
             f"in {details.get('train_seconds', 0):.0f} s"]
    log = json.loads((Path(out) / "loss.json").read_text()) if (Path(out) / "loss.json").is_file() else []
    if log:
        lines[0] += f"; training loss {log[-1]['loss']:.4f} at step {log[-1]['step']}"
    lines.append(results.markdown(record.runs))
    saved = [name for name in ("config.json", "adapter") if (Path(out) / name).exists()]
    lines.append(f"wrote {out}/results.json" + (f" and the model ({', '.join(saved)}) in {out}" if saved else ""))
    return "\n".join(lines)


def saved(args: argparse.Namespace) -> str:
    from ..train.runner import checkpoints

    recipe = getattr(args, "recipe_obj", None)
    found = checkpoints(Path(recipe.output.dir)) if recipe is not None else []
    if not found:
        return "no checkpoint was saved"
    return f"the latest checkpoint is {found[-1]}; continue with --resume"
