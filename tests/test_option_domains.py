"""Every option of every built-in scheme has a domain, and a non-finite value, a wrong type and an
out-of-range value are each refused by name, before torch is imported. The cases come from the
declarations (each scheme module's `Options`), so a new option is covered without touching this file; torch-free
code reads them from the registry's snapshot (support.json), which must say the same."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing

import pytest

import hf_posenc as hp
from hf_posenc.config import builtin_options, option_table, options_snapshot, required_options, snapshot_options
from hf_posenc.domains import domain_of
from hf_posenc.catalog import list_schemes
from hf_posenc.schemes.base import SCHEMES

# the built-in schemes torch-free code knows (the snapshot's), by the options their modules declare
OPTIONS = {name: getattr(SCHEMES.get(name), "Options", None) for name in builtin_options()}
REFRESH = "refresh the snapshot with python -c 'import hf_posenc.catalog as c; c.write_snapshot()'"

# the smallest valid options of each scheme (the required ones, from its first test setting); the bad value replaces
# one of them
REQUIRED = {name: {k: v for k, v in next(iter(SCHEMES[name].test_settings.values()), {}).items()
                   if k in required_options(name)} for name in OPTIONS if name in SCHEMES}


def _fields() -> list[tuple[str, dataclasses.Field]]:
    return [(scheme, field) for scheme, options in sorted(OPTIONS.items()) if options is not None
            for field in dataclasses.fields(options)]


def _wrong_type(hint: typing.Any) -> typing.Any:
    """A value of none of the hint's types: a string for numbers and lists, a number for strings."""
    return 3.5 if "str" in str(hint) else "abc"


def _bad_values() -> list:
    params = []
    for scheme, field in _fields():
        domain = domain_of(field)
        hint = typing.get_type_hints(OPTIONS[scheme])[field.name]
        bad = {"non-finite": float("inf"), "nan": float("nan"), "wrong type": _wrong_type(hint)}
        if domain is not None and domain.kind is list:
            bad.update({"non-finite": [float("inf")], "nan": [1.0, float("nan")]})
        if domain is not None and (outside := domain.outside()) is not None:
            bad["out of range"] = outside
        for kind, value in bad.items():
            params.append(pytest.param(scheme, field.name, value, id=f"{scheme}-{field.name}-{kind}"))
    return params


def test_the_built_in_options_are_the_registered_schemes():
    assert sorted(OPTIONS) == [s for s in list_schemes() if type(SCHEMES[s]).__module__.startswith("hf_posenc.")]
    for name, options in OPTIONS.items():
        assert SCHEMES[name].Options is options, name


@pytest.mark.parametrize("scheme,name", [(s, f.name) for s, f in _fields()])
def test_every_option_declares_a_domain_and_help(scheme, name):
    field = next(f for f in dataclasses.fields(OPTIONS[scheme]) if f.name == name)
    domain = domain_of(field)
    assert domain is not None, f"{scheme}.{name} declares no domain"
    assert field.metadata["help"]
    assert domain.choices or domain.outside() is not None, f"{scheme}.{name}: a range with no bound checks nothing"


@pytest.mark.parametrize("scheme,name,value", _bad_values())
def test_a_bad_value_is_refused_by_name(scheme, name, value):
    options = {**REQUIRED.get(scheme, {}), name: value}
    with pytest.raises(hp.PosEncError) as err:
        hp.PosEncConfig(scheme, **options)
    message = str(err.value)
    assert f"scheme {scheme!r}" in message and f"{name} must be" in message, message
    assert domain_of(next(f for f in dataclasses.fields(OPTIONS[scheme]) if f.name == name)).text() in message


BOUNDS = [
    ("yarn", {"factor": 2.0, "beta_fast": 1.0, "beta_slow": 2.0}, "beta_slow must be < beta_fast"),
    ("llama3", {"factor": 2.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}, "low_freq_factor must be < high"),
    ("t5", {"num_buckets": 32, "max_distance": 16}, "max_distance must be an int > num_buckets/2 = 16"),
    ("kerple", {"variant": "power", "r2": 2.5}, "power variant needs r2 <= 2"),
    ("yarn", {"factor": 10 ** 400}, "factor must be a number >= 1"),  # an int no float holds
]


@pytest.mark.parametrize("scheme,options,message", BOUNDS)
def test_options_that_bound_each_other(scheme, options, message):
    with pytest.raises(hp.PosEncError, match=message):
        hp.PosEncConfig(scheme, **options)


def test_the_snapshot_rebuilds_every_declaration():
    """What torch-free code checks (the dataclass rebuilt from support.json) is what each scheme module declares:
    fields, types, defaults, help, domains and relations."""
    for name, options in OPTIONS.items():
        assert options is not None, f"{name} is in the snapshot but no built-in scheme: {REFRESH}"
        declared = json.loads(json.dumps(options_snapshot(options)))
        assert builtin_options()[name] == declared, f"{name}'s options changed: {REFRESH}"
        assert options_snapshot(snapshot_options(name)) == options_snapshot(options), name


def _refusals() -> list[tuple[str, dict]]:
    """Every bad value above, and the bounds options put on each other."""
    cases = [(scheme, {**REQUIRED.get(scheme, {}), name: value}) for scheme, name, value in
             (param.values for param in _bad_values())]
    return cases + [(scheme, options) for scheme, options, _ in BOUNDS]


def test_the_torch_free_checks_refuse_as_the_schemes_do():
    """The same options, checked against the snapshot in a process without torch and against the registered
    schemes here, are refused with the same message."""
    cases = _refusals()
    code = ("import json, sys\nfrom hf_posenc.config import PosEncConfig\nfrom hf_posenc.errors import PosEncError\n"
            "out = []\nfor scheme, options in json.loads(sys.stdin.read()):\n"
            "    try:\n        PosEncConfig(scheme, **options)\n        out.append(None)\n"
            "    except PosEncError as err:\n        out.append(str(err))\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint(json.dumps(out))\n")
    run = subprocess.run([sys.executable, "-c", code], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    here = []
    for scheme, options in cases:
        with pytest.raises(hp.PosEncError) as err:
            hp.PosEncConfig(scheme, **options)
        here.append(str(err.value))
    assert json.loads(run.stdout) == here


def test_options_are_checked_without_torch():
    """What lets the CLI refuse `--opt factor=abc` in well under a second."""
    code = ("import sys\nfrom hf_posenc.config import PosEncConfig\nfrom hf_posenc.errors import PosEncError\n"
            "for scheme, options in [('yarn', {'factor': 'abc'}), ('alibi', {'scale': float('inf')}), "
            "('kerple', {'r1': float('nan')}), ('nosuch', {}), (['rope'], {})]:\n"
            "    try:\n        PosEncConfig(scheme, **options)\n        raise SystemExit('accepted')\n"
            "    except PosEncError:\n        pass\n"
            "print(PosEncConfig('yarn', factor=2).options['factor'])\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr


def test_list_prints_each_options_type_default_and_domain():
    out = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "list", "--scheme", "yarn", "--json"],
                         capture_output=True, text=True, timeout=60)
    rows = {row["option"]: row for row in json.loads(out.stdout)}
    assert rows == {row["option"]: row for row in option_table("yarn")}
    assert rows["factor"]["domain"] == "a number >= 1" and rows["beta_fast"]["default"] == 32.0
    text = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "list", "--scheme", "kerple"],
                          capture_output=True, text=True, timeout=60).stdout
    assert "| variant | a string | 'log' | one of ('log', 'power') |" in text
    bad = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "list", "--scheme", "rotary"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown scheme 'rotary'; available schemes: alibi" in bad.stderr
