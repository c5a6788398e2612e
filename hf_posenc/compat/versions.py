"""Which transformers (and peft, accelerate) this hf-posenc knows: the lowest it declares, the newest the suite
passed on, and the refusal of an older transformers before any of its internals are imported (they moved in 5)."""

from __future__ import annotations

import transformers
from packaging.version import Version

# The lowest transformers the package declares (pyproject) and CI runs the fast matrix on (`make test`
# builds a second venv with it, Makefile MIN_TRANSFORMERS); tests/test_version.py keeps the three equal.
MIN_TRANSFORMERS = "5.0.0"
# The newest transformers the whole suite passed on (what `make test`'s main venv resolved; tests/test_version.py
# keeps it equal to the installed version there). Past it, patch() runs hf_posenc.self_check first.
TESTED_THROUGH = "5.25.0"
# The other libraries a patched model meets, as (lowest declared in pyproject, newest the suite passed on);
# `hf-posenc doctor` reports the installed versions against them.
TESTED_RANGES = {"transformers": (MIN_TRANSFORMERS, TESTED_THROUGH), "peft": ("0.13", "0.21.2"),
                 "accelerate": ("1.0", "1.16.0")}


def within(version: str, low: str, high: str) -> bool:
    """`low <= version <= high` as releases compare (a local build's +suffix is ignored)."""
    return Version(low) <= Version(Version(version).base_version) <= Version(high)


def check_transformers(version: str) -> None:
    """Refuse an older transformers by name before any of its internals are imported (they moved in 5)."""
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise ImportError(f"hf-posenc needs transformers>={MIN_TRANSFORMERS}, found {version}; "
                          f"upgrade with: pip install -U 'transformers>={MIN_TRANSFORMERS}'")


check_transformers(transformers.__version__)
