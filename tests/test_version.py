"""Version policy: the minimum transformers is declared once per place that needs it (pyproject, the
package, the Makefile's second venv that CI runs the fast matrix in) and an older one is refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from hf_posenc import compat

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_makefile_and_package_name_the_same_minimum():
    pyproject = re.search(r'"transformers>=([0-9.]+)[,"]', (ROOT / "pyproject.toml").read_text()).group(1)
    makefile = re.search(r"^MIN_TRANSFORMERS\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert pyproject == makefile == compat.MIN_TRANSFORMERS
    assert Version(transformers.__version__) >= Version(compat.MIN_TRANSFORMERS)


@pytest.mark.parametrize("old", ["4.57.6", "4.0.0", "5.0.0rc3"])
def test_an_older_transformers_is_refused_with_the_fix(old):
    with pytest.raises(ImportError, match=rf"hf-posenc needs transformers>={re.escape(compat.MIN_TRANSFORMERS)}, "
                                          rf"found {re.escape(old)}; upgrade with: pip install -U"):
        compat.check_transformers(old)


def test_the_minimum_and_newer_pass():
    for version in (compat.MIN_TRANSFORMERS, transformers.__version__, "6.0.0"):
        compat.check_transformers(version)
