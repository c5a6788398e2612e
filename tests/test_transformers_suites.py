"""transformers' own model tests (Llama, GPT-2, BERT, T5) pass on hf-posenc-patched models wherever they pass
stock (issue 37; docs/testing.md). Each family's cells run in two processes, stock and patched, in this session
(tests/transformers_suite/run.py); a cell fails with its findings grouped by cause: the first error line and
example test ids. Only documented departures (tests/transformers_suite/expected_failures.json) are allowed, and the
findings measured and not fixed yet (tests/transformers_suite/open_findings.json, written by `run.py --reread
--write-open`): a cell fails on any other, and the list only shrinks.

Needs the package index once (setup.sh downloads the transformers sdist of the installed version into
out/hf-tests). All cells stay on one xdist worker: each run is itself a 2-process pytest.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from transformers_suite import junit, plan, run, tree

pytestmark = pytest.mark.xdist_group("transformers_suites")

JOBS = int(os.environ.get("HF_POSENC_SUITE_JOBS", "2"))  # workers of each inner run (0: in-process)
RESULTS: dict[str, dict[str, Any]] = {}  # family -> its stock and patched runs, compared (once per session)
CELLS = [(family, cell["label"]) for family in plan.FILES for cell in plan.planned(family)]


def family_result(family: str) -> dict[str, Any]:
    """The family's runs, made by the first of its cells to ask; saved as out/transformers-suite/<family>.json."""
    if family not in RESULTS:
        RESULTS[family] = run.run_family(family, [cell["label"] for cell in plan.planned(family)], jobs=JOBS)
        (run.OUT / f"{family}.json").write_text(json.dumps(RESULTS[family], indent=1), encoding="utf-8")
    return RESULTS[family]


@pytest.mark.parametrize(("family", "label"), CELLS, ids=[f"{f}-{label}" for f, label in CELLS])
def test_patched_model_passes_what_the_stock_model_passes(family: str, label: str) -> None:
    result = family_result(family)
    assert result["stock"]["passed"] > 0, f"the stock {family} run passed nothing: the tree is broken"
    cell = result["cells"][label]
    assert cell["passed_patched"] + cell["findings"] + cell["departures"] > 0, \
        f"{family} {label}: no test ran on a patched model ({cell['passed_unpatched']} passed unpatched)"
    found = {test["test"] for cause in cell["causes"] for test in cause["tests"]}
    new = found - OPEN.get(f"{family}/{label}", set())
    assert not new, (
        f"{family} patched with {cell['patch']!r}: {len(new)} of transformers' own tests pass stock and fail patched "
        f"and are no open finding ({sorted(new)}; junit: {run.OUT}/{family}-*.xml):\n"
        + "\n".join(run.causes(cell, width=300)))


def _open_findings() -> dict[str, set[str]]:
    """Findings measured and not fixed yet (open_findings.json): tests that pass stock and fail patched, per cell.
    Not departures: the list only shrinks (a cell that fails a test not on it fails here), and the suite is done
    when it is empty."""
    listed = json.loads(run.OPEN_FINDINGS.read_text(encoding="utf-8"))
    return {cell: set(tests) for cell, tests in listed["cells"].items()}


OPEN = _open_findings()


def test_the_plan_holds_every_scheme_each_family_supports() -> None:
    """The cells of a family are the schemes `supports` accepts on the main model class of its own tests' configs;
    a new scheme is a new cell, not a gap."""
    where, _ = tree.build()
    supported = tree.probe(where, plan.FILES)
    for family, classes in supported.items():
        anywhere = sorted({name for names in classes.values() for name in names})
        assert plan.SCHEMES[family].split() == anywhere, family
        covered = {name for cell in plan.cells(family) for name in plan.schemes_in(cell["patch"])}
        assert covered == set(anywhere), family
        if family in plan.ENCODER_ONLY:  # schemes only the encoder-only test class's models take
            seq2seq = {name for key, names in classes.items() if key.startswith(f"{plan.TEST_CLASSES[family][0]}::")
                       for name in names}
            assert plan.ENCODER_ONLY[family] == set(anywhere) - seq2seq, family
    every = {name for names in plan.SCHEMES.values() for name in names.split()}
    for family in plan.FILES:  # the sample (make test): every family, with its layer map
        assert {cell["label"] for cell in plan.sampled(family)} >= set(plan.EXTRA[family]), family
    assert {name for family in plan.FILES for cell in plan.sampled(family) for name in plan.schemes_in(cell["patch"])
            if cell["label"] not in plan.EXTRA[family]} == every  # and every scheme in some family's cell


def test_expected_failures_name_only_documented_departures() -> None:
    for entry in junit.departures():
        documented = " ".join((tree.ROOT / entry["documented_in"]).read_text(encoding="utf-8").split())
        assert entry["departure"] in documented, entry["name"]  # word for word, wherever the lines break


def test_the_comparison_counts_only_stock_passes_that_fail_patched(tmp_path: Any) -> None:
    """junit.compare on hand-written junit files: a finding, a documented departure, a pass with nothing
    patched, a test that fails stock too, a skip."""
    def testcase(name: str, body: str = "", patched: bool = True) -> str:
        prop = '<property name="posenc_patched" value="LlamaModel (built)"/>' if patched else ""
        return (f'<testcase classname="tests.models.llama.test_modeling_llama.LlamaModelTest" name="{name}">'
                f'<properties>{prop}</properties>{body}</testcase>')

    failure = '<failure message="{}">tests/test_modeling_common.py:10: in test_x\n    self.assertEqual(2, 3)</failure>'
    scaled = "test_model_rope_scaling_from_config_0_linear"  # a departure narrowed to its tests and cells
    stock = "".join(testcase(name, patched=False) for name in ("test_a", "test_b", "test_c", "test_e", scaled, "test_f"))
    stock += testcase("test_d", failure.format("AssertionError: stock"), patched=False)
    patched = "".join([
        testcase("test_a[posenc=alibi]", failure.format("AssertionError: 2 != 3")),
        testcase("test_b[posenc=alibi]", failure.format("PosEncError: '/x' lacks the weights of its 'alibi' patch: k")),
        testcase("test_c[posenc=alibi]", patched=False),
        testcase("test_d[posenc=alibi]", failure.format("AssertionError: patched")),
        testcase("test_e[posenc=alibi]", '<skipped message="no"/>'),
        testcase(f"{scaled}[posenc=alibi]", failure.format("AssertionError: True is not false")),
        testcase("test_f[posenc=alibi]", failure.format("AssertionError: True is not false")),
    ])
    for name, body in (("stock.xml", stock), ("patched.xml", patched)):
        (tmp_path / name).write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>", encoding="utf-8")
    cell = junit.compare(junit.read(tmp_path / "stock.xml"), junit.read(tmp_path / "patched.xml"), "alibi")
    assert {k: cell[k] for k in ("ran", "findings", "departures", "passed_unpatched", "failed_stock_too", "skipped")} \
        == {"ran": 7, "findings": 2, "departures": 2, "passed_unpatched": 1, "failed_stock_too": 1, "skipped": 1}
    where = "self.assertEqual(2, 3) (tests/test_modeling_common.py:10)"
    assert cell["causes"] == [{"first_line": "AssertionError: 2 != 3", "tests": [
        {"test": "LlamaModelTest::test_a", "where": where}]}, {"first_line": "AssertionError: True is not false",
        "tests": [{"test": "LlamaModelTest::test_f", "where": where}]}]
    other = junit.compare(junit.read(tmp_path / "stock.xml"), junit.read(tmp_path / "patched.xml").copy(), "nope")
    assert other["ran"] == 0  # the cell label is part of the case: a narrowed departure applies to its cells only
