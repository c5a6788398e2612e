"""`hf-posenc train`: run a recipe in this process, or launch it through `accelerate launch` with a
shipped or given accelerate config (each process then runs `python -m hf_posenc.train --config RECIPE`, the form
`accelerate launch` takes by hand)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from ..progress import waiting
from .checks import model_folder
from .launch import accelerate_config, launch, launch_settings

EPILOG = """examples:
  hf-posenc train recipes/smollm2-135m/alibi/config_smoke.yaml --max_steps 20
  hf-posenc train recipes/minilm-l6/rope/config_smoke.yaml --accelerate-config cpu_2proc
  hf-posenc train recipes/smollm2-135m/yarn/config_4x.yaml --resume
  hf-posenc train recipes/smollm2-135m/yarn/config_4x.yaml --resume auto   # continue if a checkpoint exists
  accelerate launch --config_file CFG -m hf_posenc.train --config RECIPE.yaml --learning_rate 5e-4

any recipe field is overridden by --field VALUE (lists as --lora_target_modules q_proj v_proj, mappings as YAML:
--scheme_options '{factor: 8}'); the fields are transformers.TrainingArguments' and these:
"""


def make_parser(parser: argparse.ArgumentParser) -> None:
    from ..train.recipe import OURS, UNSUPPORTED

    parser.description = "Swap a model's positional scheme and recover it with accelerate + peft, as a recipe says."
    fields = [f"  {cls.__name__}: {', '.join(f.name for f in dataclasses.fields(cls) if f.name not in UNSUPPORTED)}"
              for cls in OURS.values()]
    parser.epilog = EPILOG + "\n".join([*fields, f"  (TRL's {', '.join(UNSUPPORTED)}: refused unless at their defaults)"])
    parser.add_argument("recipe", help="recipe YAML (see recipes/)")
    parser.add_argument("--accelerate-config", dest="accelerate_config", default=None,
                        help="launch through `accelerate launch` with this config (name or path)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, choices=["auto"], metavar="auto",
                        help="continue from the latest checkpoint in output_dir (an error if there is none); "
                             "`--resume auto`: continue if there is one, else start")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in output_dir")
    # set by the launching process, which ran the preflight checks once and passes on what they resolved:
    # --resume / --overwrite as the run does them (`--resume auto` settled)
    parser.add_argument("--checked", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(overrides=[])  # the recipe-field options the dispatcher does not know


def check(args: argparse.Namespace) -> None:
    """The recipe, the batch split over the processes, the output folder, the scheme and the data:
    `preflight`, once, here (in the launching process when there is one), its result kept for `main`."""
    from ..train import load_recipe

    args.recipe_obj = recipe = load_recipe(args.recipe, args.overrides)  # torch-free: refused at once
    if args.checked:  # a launched process: the launching one checked, and settled resume and overwrite
        from ..train import Checked

        args.config_path, args.preflight = None, Checked(None, bool(args.resume), args.overwrite)
        return
    model_folder(recipe.model.model_name_or_path, f"{recipe.source}: model_name_or_path")
    args.config_path, args.launch = None, {}
    if args.accelerate_config is not None:
        args.config_path = accelerate_config(args.accelerate_config)
        args.launch = launch_settings(args.config_path)
    # under a launcher of the user's own (`accelerate launch -m hf_posenc.train --config`) torchrun says how many
    world = args.launch.get("num_processes", 1) if args.config_path else int(os.environ.get("WORLD_SIZE", "1"))
    with waiting("train: checking the output folder, the model's config and the data"):
        from ..train import preflight  # torch: after every torch-free check

        args.preflight = preflight(recipe, args.resume, args.overwrite, world)


def main(args: argparse.Namespace) -> int:
    checked = args.preflight
    if args.config_path is None:
        from ..train import train
        from ..train.trainer import Interrupted

        from accelerate import PartialState

        try:
            record = train(args.recipe_obj, checked=checked)
        except Interrupted as stop:
            return interrupted(args, stop.signum)
        if PartialState().is_main_process:  # under `accelerate launch`, rank 0 speaks for all
            print(summary(record, args.recipe_obj.training.output_dir))
        return 0
    flags = ["--checked", *(["--resume"] if checked.resume else []), *(["--overwrite"] if checked.overwrite else [])]
    try:
        return launch(args.config_path, args.launch,
                      ["hf_posenc.train", "--config", args.recipe, *args.overrides, *flags], "training")
    except SystemExit as stop:  # accelerate's launchers exit 128 + the signal, once their processes have stopped
        if not isinstance(stop.code, int) or stop.code <= 128:
            raise
        return interrupted(args, stop.code - 128)


def interrupted(args: argparse.Namespace, signum: int) -> int:
    """Say that a signal stopped the run and what goes on from there (`saved`); returns the status a shell gives a
    process the signal killed (Ctrl-C: 130, SIGTERM: 143). Rank 0 speaks for a launch, and a process that
    `--accelerate-config` started leaves it to the launching one, which names the command with the config."""
    if not args.checked and os.environ.get("RANK", "0") == "0":
        print(f"\n{args._prog}: interrupted ({signal.Signals(signum).name}); {saved(args)}", file=sys.stderr)
    return 128 + signum


def summary(record: Any, out: str) -> str:
    """What a finished run did: steps, last logged loss, held-out perplexity, where the model is."""
    from .. import results

    details = record.details
    lines = [f"trained {details.get('steps')} steps on {details.get('world_size')} process(es) "
             f"in {details.get('train_seconds', 0):.0f} s"]
    log = json.loads((Path(out) / "loss.json").read_text()) if (Path(out) / "loss.json").is_file() else []
    if log:
        lines[0] += f"; training loss {log[-1]['loss']:.4f} at step {log[-1]['step']}"
    lines.append(results.markdown(record.runs, record.tables()))
    saved = [name for name in ("config.json", "adapter") if (Path(out) / name).exists()]
    lines.append(f"wrote {out}/results.json" + (f" and the model ({', '.join(saved)}) in {out}" if saved else ""))
    return "\n".join(lines)


def saved(args: argparse.Namespace) -> str:
    """What a stopped or failed run left, and the command that goes on from there: `--resume` from a checkpoint, else
    the same command, which starts over the run it left unfinished (`run_folder.check_output`). A process that
    `--accelerate-config` started names no command: the launching one names it, with the config."""
    from ..train.run_folder import checkpoints

    recipe = getattr(args, "recipe_obj", None)
    found = checkpoints(Path(recipe.training.output_dir)) if recipe is not None else []
    left = f"the latest checkpoint is {found[-1]}" if found else "no checkpoint was saved"
    if args.checked:
        return left
    config = ["--accelerate-config", args.accelerate_config] if args.accelerate_config else []
    # under a launcher of the user's own (torchrun, `accelerate launch`) the command is theirs, with these arguments
    own = int(os.environ.get("WORLD_SIZE", "1")) > 1
    command = f"<your launcher> -m hf_posenc.train --config {shlex.join([args.recipe, *args.overrides])}" if own \
        else f"hf-posenc train {shlex.join([args.recipe, *args.overrides, *config])}"
    if found:
        return f"{left}; continue with: {command} --resume"
    return f"{left}; start the run again with: {command}" + " --overwrite" * args.overwrite
