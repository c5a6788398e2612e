"""`python -m hf_posenc.train RECIPE.yaml [--section.field value ...] [--resume | --overwrite]`:
what `accelerate launch -m hf_posenc.train` runs in each process."""

import sys

from ..cli import run_alone

sys.exit(run_alone("train", sys.argv[1:]))
