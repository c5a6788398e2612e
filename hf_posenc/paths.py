"""Where hf-posenc keeps what it makes once and reads many times (built datasets, unpacked models, self-check
verdicts): `$HF_POSENC_CACHE`, else ~/.cache/hf_posenc."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("HF_POSENC_CACHE") or Path.home() / ".cache" / "hf_posenc").expanduser()
