"""Starting the processes of an accelerate config, for `hf-posenc train` and `hf-posenc eval` alike.

Each process runs a module with its arguments (TRL's way): `python -m hf_posenc.train --config RECIPE.yaml ...`
for training, `python -m hf_posenc.cli eval ...` for evaluation: the same dispatcher, parser and checks as the command
typed by hand, so the library never calls back up into the command line.
"""

from __future__ import annotations

import importlib.resources
import os
import socket
from pathlib import Path
from typing import Any

from ..errors import PosEncError


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


def launch_settings(path: Path) -> dict[str, Any]:
    """An accelerate config file as a mapping, its process count a positive integer."""
    from ..train.reading import read_yaml

    config = read_yaml(path, "accelerate config") or {}
    processes = config.get("num_processes", 1) if isinstance(config, dict) else None
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        raise PosEncError(f"{path}: an accelerate config is a YAML mapping whose num_processes is an integer >= 1 "
                          f"(see `accelerate config`), got {config!r:.80}")
    return config


def _free_port() -> int:
    """torchrun's default port 29500 may be held by another job on a shared machine: its workers would wait forever."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(path: Path, config: dict[str, Any], command: list[str], what: str) -> int:
    """`accelerate launch --config_file PATH -m MODULE ARGS...`: the processes the config asks for, each running
    the module `COMMAND[0]` with the arguments `COMMAND[1:]`.

    Args:
        path, config: the accelerate config file and its settings (`launch_settings`).
        command: the module and its arguments, e.g. ["hf_posenc.train", "--config", "recipe.yaml", "--checked"].
        what: what the processes do, for the error when they fail ("training").
    """
    from accelerate.commands.launch import launch_command, launch_command_parser

    if config.get("use_cpu"):
        os.environ["ACCELERATE_USE_CPU"] = "true"  # torchrun children do not get it from the config
    port = [] if config.get("main_process_port") else ["--main_process_port", str(_free_port())]
    argv = ["--config_file", str(path), *port, "-m", *command]
    try:
        launch_command(launch_command_parser().parse_args(argv))
    except Exception as err:  # the children printed their own tracebacks
        raise PosEncError(f"the {config.get('num_processes', 1)} {what} processes failed ({type(err).__name__}); "
                          "their messages are above") from None
    return 0
