"""benchmarks/lengthgen: the length-generalisation study's pipeline on the smoke budget, and its refusals of bad
input before any training (nothing written)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import benchmark_scripts

from hf_posenc.errors import PosEncError

@pytest.fixture
def run():
    with benchmark_scripts("lengthgen"):
        import run as study

        yield study


def test_the_smoke_study_writes_gated_runs_tables_and_a_plot_and_resumes(tmp_path, run):

    out = tmp_path / "study"
    start = time.process_time()
    assert run.main(["--smoke", "--arms", "nope,learned", "--out", str(out)]) == 0
    seconds = time.process_time() - start  # CPU time (one process, one thread): wall time depends on the load
    saved = json.loads((out / "results.json").read_text())
    s = run.SMOKE
    assert sorted((r["arm"], r["task"], r["seed"]) for r in saved["runs"]) == [
        ("learned", "copy", 0), ("learned", "repeat", 0), ("nope", "copy", 0), ("nope", "repeat", 0)]
    for r in saved["runs"]:
        assert set(r["ood_by_length"]) == {str(n) for n in s.test_lengths}
        assert set(r["iid_by_length"]) == {str(n) for n in s.train_lengths}
        assert r["iid"]["n"] == s.iid_per_length * len(s.train_lengths)
        assert r["gate"] == (r["iid"]["exact_match"] >= s.gate)  # failed gates are kept, marked
        cell = r["ood_by_length"][str(s.test_lengths[-1])]
        assert cell["n"] == s.test_per_length and 0 <= cell["low"] <= cell["exact_match"] <= cell["high"] <= 1
        assert r["train_seconds"] > 0 and r["params"] > 0 and r["steps"] == s.steps_of(r["task"])
        if r["arm"] == "learned":  # positions added to the tokens: their geometry and layer 0's four terms
            shares = r["geometry"]["four_terms"]
            assert 0 < r["geometry"]["position_energy_in_token_subspace"] <= 1
            assert set(shares) == {"content-content", "content-position", "position-content", "position-position"}
            assert all(0 <= v <= 1 for v in shares.values()) and shares["position-position"] > 0
        else:
            assert r["geometry"] is None
    assert saved["settings"]["gate"] == 0.95 and saved["settings"]["steps"] == s.steps
    table = (out / "results.md").read_text()
    assert "### repeat" in table and "### Runs that failed the in-distribution gate" in table
    failed = [r for r in saved["runs"] if not r["gate"]]
    # the smoke budget fits learned (its table) on both tasks and not nope: the ranking reads counted runs only
    assert len(failed) < len(saved["runs"]), "no smoke run passed the gate: the ranking is not exercised"
    assert "### MRR over the paper's five schemes" in table and "### MRR over every arm" in table
    assert "| learned | 1.00 | 1.00 |" in table  # first tier over its seed, every arm over seed 0: both rank it first
    geometry = table.split("### Added positions")[1]  # only learned adds positions, and only its counted runs show
    assert "| learned | repeat |" in geometry and "| nope |" not in geometry  # the one arm with counted runs ranks first on both tasks
    assert all(f"{r['arm']} / {r['task']} / seed {r['seed']}" in table for r in failed)
    assert (out / "results.png").stat().st_size > 1000
    assert seconds < 60, f"the smoke study took {seconds:.0f} s of CPU"
    # a rerun keeps the finished runs (resumable after a kill: each run is its own file) and adds what is new
    before = (out / "runs" / "nope-copy-seed0.json").stat().st_mtime_ns
    (out / "runs" / "learned-copy-seed0.json").unlink()  # as if killed before this run finished
    assert run.main(["--smoke", "--arms", "nope,learned", "--out", str(out)]) == 0
    assert (out / "runs" / "nope-copy-seed0.json").stat().st_mtime_ns == before
    again = json.loads((out / "results.json").read_text())["runs"]
    assert len(again) == 4 and {r["arm"] for r in again} == {"nope", "learned"}


def _run(arm, task, seed, ood, gate=True):
    return {"arm": arm, "task": task, "seed": seed, "gate": gate, "ood": {"exact_match": ood}}


def test_the_ranking_has_a_column_per_task_and_seed_and_a_failed_gate_ranks_last(run):
    """As their notebook ranks: one column per (task split, seed), not the mean over seeds; here a run that failed
    the gate or did not run ranks last, and a column where no run counted is left out."""
    import report

    runs = [_run("x", "copy", 0, 0.9), _run("y", "copy", 0, 0.5),
            _run("x", "copy", 1, 0.1), _run("y", "copy", 1, 0.8),
            _run("x", "sort", 0, 1.0, gate=False), _run("y", "sort", 0, 0.2),
            _run("x", "sort", 1, 0.7, gate=False), _run("y", "sort", 1, 0.6, gate=False)]
    table = report.columns(runs, ["x", "y"], ["copy", "sort"], [0, 1])
    assert table == {"copy/seed 0": {"x": 0.9, "y": 0.5}, "copy/seed 1": {"x": 0.1, "y": 0.8},
                     "sort/seed 0": {"x": -1.0, "y": 0.2}}
    ranked, cols = report.ranking_table(runs, ["x", "y"], ["copy", "sort"], [0, 1])
    # x ranks 1, 2, 2 and y 2, 1, 1; the mean over seeds (x 0.5, y 0.65) would have given copy to y alone
    assert ranked == pytest.approx({"y": (1 / 2 + 1 + 1) / 3, "x": (1 + 1 / 2 + 1 / 2) / 3}) and len(cols) == 3
    assert report.ranking_table(runs, ["x", "y"], ["sort"], [1]) == ({}, [])


def test_the_ranking_beside_the_paper_is_plotted(tmp_path, run):
    import report

    settings = {"arms": {"nope": {}, "alibi": {}, "learned": {}}, "tasks": ["copy"]}
    runs = [_run("nope", "copy", 0, 0.9), _run("alibi", "copy", 0, 0.4), _run("learned", "copy", 0, 0.0)]
    assert report.draw_ranking(runs, settings, tmp_path).stat().st_size > 1000
    assert report.draw_ranking(runs[2:], settings, tmp_path / "none") is None  # no arm of theirs ran: no figure


def test_a_run_file_of_the_full_budget_is_recognised_on_resume(run):
    """The full budget's per-task steps (tuples) compare equal to what a run file holds (JSON lists): else a
    rerun would train every finished run again."""
    assert run.FULL.task_steps and json.loads(json.dumps(run.budget(run.FULL))) == run.budget(run.FULL)
    assert [run.FULL.steps_of(t) for t in ("repeat", "copy")] == [dict(run.FULL.task_steps)["repeat"], run.FULL.steps]


@pytest.mark.parametrize("argv, match", [
    (["--tasks", "add"], "unknown length-generalisation task 'add'"),
    (["--arms", "rope,bogus"], "unknown arm.*bogus"),
    (["--train-lengths", "1-10", "--test-lengths", "5-20"], "test lengths must all be longer"),
    (["--arms", "learned", "--positions", "8"], "--positions 8: the learned arm's table cannot hold"),
    (["--train-lengths", "1-x"], "--train-lengths must be integers"),
    (["--steps", "0"], "--steps must be at least 1"),
])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, argv, match, run):

    with pytest.raises(PosEncError, match=match):
        run.main(["--smoke", *argv, "--out", str(tmp_path / "new")])
    assert not (tmp_path / "new").exists()


def test_out_over_a_folder_the_study_did_not_write_is_refused(tmp_path, run):

    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(PosEncError, match="not a folder this study wrote"):
        run.main(["--smoke", "--arms", "nope", "--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
