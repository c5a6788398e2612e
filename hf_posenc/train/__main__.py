"""`python -m hf_posenc.train RECIPE.yaml [--section.field value ...] [--resume | --overwrite]`."""

import sys

from . import cli_main

sys.exit(cli_main())
