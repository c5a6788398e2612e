"""Version policy: the minimum transformers is declared once per place that needs it (pyproject, the
package, the Makefile's second venv that CI runs the fast matrix in) and an older one is refused by name."""

from __future__ import annotations

import re
import sys
import sysconfig
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


def pinned() -> dict[str, str]:
    """constraints.txt: the versions `make demo` and `make test` install into .venv."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {name.lower().replace("_", "-"): version for name, version in
            (line.split("==") for line in lines if line and not line.startswith("#"))}


@pytest.mark.parametrize("library", sorted(compat.TESTED_RANGES))
def test_tested_through_is_what_the_constraints_pin(library):
    """The newest version hf-posenc says it was tested on is the one its own installs pin: raising one without the
    other (a release-check passed but not pinned, or pinned without the whole suite) fails here."""
    assert Version(pinned()[library]) == Version(compat.TESTED_RANGES[library][1])


def test_the_constraints_pin_every_package_the_main_venv_holds_but_torch():
    from importlib import metadata

    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("only .venv is built from constraints.txt (make install); this is another venv")
    # what is installed in the venv's site-packages (not what a package vendors and puts on sys.path: setuptools)
    site = sysconfig.get_paths()["purelib"]
    installed = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in metadata.distributions(path=[site])}
    unpinned = sorted(set(installed) - set(pinned()) - {"torch", "hf-posenc", "pip", "setuptools", "wheel"})
    assert not unpinned, f"installed but not in constraints.txt: {unpinned} (make constraints)"
    differ = {name: (installed[name], version) for name, version in pinned().items() if installed.get(name) != version}
    assert not differ, f"installed != pinned: {differ}"


@pytest.mark.parametrize("library", sorted(compat.TESTED_RANGES))
def test_tested_ranges_start_at_what_pyproject_declares(library):
    declared = re.search(rf'"{library}>=([0-9.]+)[,"]', (ROOT / "pyproject.toml").read_text()).group(1)
    assert declared == compat.TESTED_RANGES[library][0]
