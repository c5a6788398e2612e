"""`python -m hf_posenc.train --config RECIPE.yaml [--field value ...]`: TRL's script form of `hf-posenc train
RECIPE.yaml`, so that `accelerate launch --config_file CFG -m hf_posenc.train --config RECIPE.yaml` (the way TRL's
and the alignment-handbook's recipes are launched) runs the same checks and the same run in each process. The script
becomes that command's process (`os.execv`: same PID, environment and signals), as the commands sit a floor above
the training they run."""

import os
import sys

from ..errors import PosEncError


def command(argv: list[str]) -> list[str]:
    """The `hf-posenc train` arguments of a script call: `--config X` (or `--config=X`) becomes the recipe."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return ["train", argv[i + 1], *argv[:i], *argv[i + 2:]]
        if arg.startswith("--config="):
            return ["train", arg.partition("=")[2], *argv[:i], *argv[i + 1:]]
    if any(a in ("-h", "--help") for a in argv):
        return ["train", "--help"]
    raise PosEncError("python -m hf_posenc.train: give the recipe as --config RECIPE.yaml (a file or a shipped "
                      "recipe's name, `hf-posenc recipes`); the other arguments are those of `hf-posenc train`")


if __name__ == "__main__":
    try:
        arguments = command(sys.argv[1:])
    except PosEncError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    os.execv(sys.executable, [sys.executable, "-m", "hf_posenc.cli", *arguments])
