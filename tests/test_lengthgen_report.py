"""The committed length-generalisation study regenerates from its run files (issue 57): results.json holds exactly
the run files' records, results.md and both plots are what `report` makes of them byte for byte, the T5 probe's page
is what its JSON says, and the README's study table carries the headline's numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import benchmark_scripts

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "benchmarks" / "lengthgen" / "results"


@pytest.fixture(scope="module")
def scripts():
    with benchmark_scripts("lengthgen"):
        import report
        import run
        import t5_probe

        yield run, report, t5_probe


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads((STUDY / "results.json").read_text())


def test_results_json_is_the_run_files(scripts, saved):
    run, _, _ = scripts
    assert saved["runs"] == run.finished(STUDY, run.budget(run.FULL))  # the old study's files match its budget
    assert len(saved["runs"]) == len(list((STUDY / "runs").glob("*.json"))) == 132


def test_results_md_and_plots_regenerate_identically(scripts, saved, tmp_path):
    _, report, _ = scripts
    assert report.summary(saved["runs"], saved["settings"]) == (STUDY / "results.md").read_text()
    report.draw(saved["runs"], saved["settings"], tmp_path)
    report.draw_ranking(saved["runs"], saved["settings"], tmp_path)
    for name in ("results.png", "ranking.png"):
        assert (tmp_path / name).read_bytes() == (STUDY / name).read_bytes(), name


def test_the_t5_probe_page_is_its_json(scripts):
    _, _, t5_probe = scripts
    found = json.loads((STUDY / "t5_probe" / "t5_probe.json").read_text())
    assert t5_probe.report(found) == (STUDY / "t5_probe" / "t5_probe.md").read_text()
    # the study's own T5 run on repeat, seed 0: the probe retrained the same model
    study_run = json.loads((STUDY / "runs" / "t5-repeat-seed0.json").read_text())["run"]
    assert {n: round(c["exact_match"], 3) for n, c in study_run["ood_by_length"].items()} == found["ood_by_length"]


def test_the_headline_orders_hold_in_every_seed_with_and_without_the_gate(scripts, saved):
    _, report, _ = scripts
    arms = ["nope", "t5", "alibi", "rope_partial", "sinusoidal"]
    tasks = saved["settings"]["tasks"]
    per_seed = [report.seed_mrr(saved["runs"], arms, tasks, gated) for gated in (True, False)]
    sure, undecided = report.decided(per_seed, arms)
    for pair in sure:
        a, b = pair.split(" > ")
        assert all(m[a] > m[b] for ranking in per_seed for m in ranking.values()), pair
    assert len(sure) + len(undecided) == 10
    table = (STUDY / "results.md").read_text()
    assert "Orders every seed agrees on, with the gate and without: NoPE > T5" in table


def test_the_readme_study_table_is_the_results(saved):
    """Every MRR in the README's study table is one results.md prints for the same scheme."""
    readme = (REPO / "README.md").read_text()
    table = (STUDY / "results.md").read_text()
    headline = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| \w+ \((\w+)\) \| ([\d.]+) \| ([\d.]+) \|", table, re.M)}
    rows = re.findall(r"^\| [^|]*\(`(\w+)`\) \| ([\d.]+) \|", readme, re.M)
    assert rows, "the README's study table is gone"
    for arm, mrr in rows:
        assert arm in headline and mrr == headline[arm][0], (arm, mrr, headline.get(arm))


def test_the_readme_ungated_order_is_the_results():
    readme = (REPO / "README.md").read_text()
    sentence = readme.split("Without the gate the MRR order is ")[1].split(". ")[0]
    stated = dict(re.findall(r"(\w+) \((\d\.\d\d)\)", sentence))
    table = (STUDY / "results.md").read_text()
    ungated = {m.group(1): m.group(2) for m in re.finditer(r"^\| (\w+) \(\w+\) \| [\d.]+ \| ([\d.]+) \|", table, re.M)}
    assert stated == ungated and list(stated) == sorted(stated, key=lambda s: -float(stated[s]))
