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


def test_no_upper_bound_on_transformers():
    """`pip install hf-posenc` never downgrades a user's transformers: past TESTED_THROUGH the self-check decides."""
    requirement = re.search(r'"transformers([^"]*)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert requirement == f">={compat.MIN_TRANSFORMERS}"


@pytest.mark.skipif(Version(transformers.__version__) == Version(compat.MIN_TRANSFORMERS),
                    reason="the minimum's venv (make test-min) runs the oldest transformers, not the newest")
@pytest.mark.parametrize("library", sorted(compat.TESTED_RANGES))
def test_tested_through_is_what_this_suite_runs_on(library):
    """`make test`'s main venv resolves the newest releases: when one appears, this fails until the whole suite has
    passed on it and TESTED_THROUGH (and the catalogs) say so."""
    from importlib import metadata

    high = compat.TESTED_RANGES[library][1]
    assert Version(metadata.version(library)) == Version(high), f"{library} {metadata.version(library)} is not {high}"


@pytest.mark.parametrize("library", sorted(compat.TESTED_RANGES))
def test_tested_ranges_start_at_what_pyproject_declares(library):
    declared = re.search(rf'"{library}>=([0-9.]+)[,"]', (ROOT / "pyproject.toml").read_text()).group(1)
    assert declared == compat.TESTED_RANGES[library][0]
