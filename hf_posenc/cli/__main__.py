"""`python -m hf_posenc.cli ...` is `hf-posenc ...`."""

import sys

from . import main

sys.exit(main())
