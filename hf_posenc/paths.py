"""Where hf-posenc keeps what it makes once and reads many times: the snapshots shipped in the package (read
torch-free), and the user's cache (built datasets, unpacked models, self-check verdicts): `$HF_POSENC_CACHE`, else
~/.cache/hf_posenc."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("HF_POSENC_CACHE") or Path.home() / ".cache" / "hf_posenc").expanduser()


# What `hf-posenc list` prints and the built-in schemes' options `PosEncConfig` checks, written by
# `catalog.write_snapshot()`: the catalog imports torch, the list and the option checks must not.
SNAPSHOT = Path(__file__).with_name("support.json")
# The generic adapter's verdict per causal-LM model type, checked by the zoo sweep (benchmarks/zoo_catalog.py).
MODEL_TYPES = Path(__file__).with_name("model_types.json")
# The same for encoder-decoder model types, stack by stack (benchmarks/seq2seq_catalog.py).
SEQ2SEQ_TYPES = Path(__file__).with_name("seq2seq_types.json")
