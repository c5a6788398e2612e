"""benchmarks/layers.py's x axis, the share of positions kept, and its table's empty cells, on a tiny Llama
(the benchmark itself runs SmolLM2-135M for hours; its numbers live in benchmarks/results/layers.json)."""

from __future__ import annotations

import sys

import pytest
from conftest import tiny_model
from test_train import REPO

import hf_posenc as hp
from hf_posenc import results

sys.path.insert(0, str(REPO / "benchmarks"))
import layers as bench  # noqa: E402


def test_every_kth_layer_counts_from_the_kth():
    assert bench.every(4)[:3] == (3, 7, 11) and len(bench.every(2)) == 15 and bench.every(1) == tuple(range(30))


@pytest.mark.parametrize("scheme, options, share", [
    (None, {}, 1.0),
    ("nope", {}, 0.0),
    ("nope", {"layers": [1]}, 0.5),  # one layer of two without rotation
    ("p_rope", {"p": 0.5}, 0.5),
    ("p_rope", {"p": 0.5, "layers": [0]}, 0.75),  # half the pairs in half the layers
    ("alibi", {}, None),  # no subset of RoPE's rotations: no share to speak of
])
def test_share_kept_counts_rotating_layer_and_pair_slots(scheme, options, share):
    model = tiny_model("llama")
    if scheme is not None:
        hp.patch(model, scheme, **options)
    assert bench.share_kept(model) == share


def test_hope_keeps_the_pairs_its_rotary_keeps():
    model = hp.patch(tiny_model("llama"), "hope")
    kept = [m for m in model.modules() if isinstance(m, bench.KeptFrequencies)]
    assert kept and 0.0 < bench.share_kept(model) == kept[0].kept / kept[0].rotary.rotated_pairs < 1.0


def test_a_layer_map_has_no_one_share():
    assert bench.share_kept(hp.patch(tiny_model("llama"), {"nope": [0], "p_rope": [1]})) is None


def test_the_table_marks_cells_not_reached_and_skipped(tmp_path):
    record = results.Results("eval", "smollm2", settings={"task_lengths": [2048, 4096], "ppl_lengths": [512], "samples": 10},
                             details={"arms": {"a": {"family": "p-rope", "share_kept": 0.5}}})
    run = results.Run("a", "p_rope", {"p": 0.5})
    run.put("passkey", 2048, {"accuracy": 0.0, "n": 10, "low": 0.0, "high": 0.28, "trials": 10})
    run.put("passkey", 4096, {"skipped": "0/10 at 2048"})
    record.runs.append(run)
    bench.write_report(record, tmp_path / "layers.json")
    row = next(line for line in (tmp_path / "layers.md").read_text().splitlines() if line.startswith("| a |"))
    assert "0.00 [0.00, 0.28] (n=10)" in row and "skipped (0/10 at 2048)" in row and "–" in row  # niah not reached
    assert (tmp_path / "layers.png").stat().st_size > 0


def test_plot_labels_are_distinct_unclipped_and_do_not_overlap():
    # (label, x, y) in points on the page: three arms on one spot, one alone, one at the panel's right edge
    points = [("original (rope)", 100.0, 50.0), ("original (rope)", 100.0, 52.0), ("hope", 101.0, 50.0),
              ("nope (all layers)", 10.0, 300.0), ("original (rope), same fine-tuning (control), after recovery "
                                                    "(smoke recipe)", 390.0, 200.0)]
    notes = bench._annotations(points, right=400.0)
    texts = [text for text, _, _ in notes]
    assert len(set(texts)) == len(texts) and texts[1] == "original (rope) #2"
    assert texts[4] == "rope, fine-tuned (control), recovered"
    assert len({(offset, side) for _, offset, side in notes[:3]}) == 3  # three points on one spot: three places
    assert notes[3][1] == notes[0][1] == (5.0, 3.0) and notes[3][2] == "left"  # a point alone keeps the first place
    assert notes[4][2] == "right" and notes[4][1][0] < 0  # near the right edge: the text goes left, not clipped
