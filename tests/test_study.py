"""benchmarks/study: the controlled study's pipeline on a smoke budget (2 arms x 1 seed x 4 steps)."""

from __future__ import annotations

import json
import sys
import time

import pytest
from test_train import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "study"))


@pytest.mark.slow
def test_the_study_smoke_run_writes_every_measurement(tmp_path):
    import run

    start = time.perf_counter()
    assert run.main(["--smoke", "--out", str(tmp_path)]) == 0
    seconds = time.perf_counter() - start
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [(r["arm"], r["seed"]) for r in saved["runs"]] == [("learned", 0), ("rope", 0)]
    s = run.SMOKE
    assert saved["settings"]["tokens_per_run"] == s.steps * s.batch_size * s.seq_len
    learned, rope = saved["runs"]
    for r in saved["runs"]:
        assert r["tokens"] == s.tokens and r["params"] > 0
        assert set(r["metrics"]["perplexity"]) == {str(s.seq_len), str(2 * s.seq_len), str(4 * s.seq_len)}
        assert set(r["metrics"]["passkey"]) == set(r["metrics"]["perplexity"])
    # rope runs every length on the same targets; GPT-2's learned table stops at the training length
    cells = rope["metrics"]["perplexity"]
    assert all(c["perplexity"] > 1 and c["mode"] == "same_target" for c in cells.values())
    assert len({c["targets"] for c in cells.values()}) == 1
    assert "IndexError" in learned["metrics"]["perplexity"][str(4 * s.seq_len)]["skipped"]
    # the added arm's geometry at init, at the checkpoint and at the end; none for rope
    trace = learned["metrics"]["geometry"]
    assert [g["step"] for g in trace] == [0, s.steps // s.checkpoints, s.steps] and "geometry" not in rope["metrics"]
    for g in trace:
        assert 0 <= g["position_energy_in_token_subspace"] <= 1
        assert sum(g["four_terms"].values()) <= 1 + 1e-6
    assert trace[0]["four_terms"] != trace[-1]["four_terms"]  # the checkpoints hold different weights
    table = (tmp_path / "results.md").read_text()
    assert table.startswith("| arm | seeds | params | ppl @ 32") and "| rope | 1 |" in table
    assert (tmp_path / "study.png").stat().st_size > 1000
    # a rerun with the same budget keeps the runs it has
    assert run.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == saved["runs"]
    assert seconds < 60, f"the smoke study took {seconds:.0f} s"


def test_an_unknown_arm_names_the_arms(tmp_path):
    import run

    with pytest.raises(run.hp.PosEncError, match="unknown arm.*the arms are learned, sinusoidal, concat_d8"):
        run.main(["--arms", "learned,fourier", "--out", str(tmp_path)])


def test_the_committed_study_is_what_the_readme_reports():
    """benchmarks/study/results.json has the issue's format, 3 seeds of every arm at the full budget, and the
    docs' "What we found" tables are results.md (docs/benchmarks/study.md includes it), which the run writes from it."""
    import run

    saved = json.loads((REPO / "benchmarks" / "study" / "results.json").read_text())
    s = run.FULL
    assert saved["settings"]["tokens_per_run"] == s.tokens and saved["settings"]["steps"] == s.steps
    assert sorted({r["arm"] for r in saved["runs"]}) == sorted(run.arms(s.width))
    for arm in run.arms(s.width):
        assert sorted(r["seed"] for r in saved["runs"] if r["arm"] == arm) == list(s.seeds)
    for r in saved["runs"]:
        assert set(r) == {"arm", "seed", "tokens", "params", "metrics"} and r["tokens"] == s.tokens
    expected = run.summary(saved["runs"], s) + "\n" + run.geometry_summary(saved["runs"])
    assert (REPO / "benchmarks" / "study" / "results.md").read_text() == expected
    assert '--8<-- "benchmarks/study/results.md"' in (REPO / "docs" / "benchmarks" / "study.md").read_text()
