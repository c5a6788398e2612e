"""benchmarks/study: the controlled study's pipeline on a smoke budget (2 arms x 1 seed x 4 steps)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from conftest import benchmark_scripts
from test_train import REPO



@pytest.fixture(autouse=True)
def study_scripts():
    with benchmark_scripts("study"):
        yield

# the 30 runs of the first study, which docs/benchmarks/study.md discusses
FIRST_ARMS = ("learned", "sinusoidal", "concat_d8", "concat_d4", "concat_wide", "untied", "rope", "alibi", "t5", "nope")


@pytest.mark.slow
def test_the_study_smoke_run_writes_every_measurement(tmp_path):
    import run

    start = time.process_time()
    assert run.main(["--smoke", "--out", str(tmp_path)]) == 0
    seconds = time.process_time() - start  # CPU time (one process): wall time depends on the machine's load
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
    assert seconds < 60, f"the smoke study took {seconds:.0f} s of CPU"
    # a rerun with the same budget keeps the runs it has; --arms appends an arm after them
    assert run.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == saved["runs"]
    assert run.main(["--smoke", "--arms", "rope,cope", "--out", str(tmp_path)]) == 0
    grown = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert grown[:2] == saved["runs"] and [(r["arm"], r["seed"]) for r in grown[2:]] == [("cope", 0)]
    assert "| cope | 1 |" in (tmp_path / "results.md").read_text()


def test_every_arm_patches_the_study_model_as_the_runner_does_and_trains_all_of_it(tmp_path):
    """The smoke run trains two arms; every arm of arms.py is built here as `one_run` builds it (random init,
    the recipe's patch, full fine-tuning), and one backward step reaches every parameter, those the patch
    installs included (t5's buckets, pope's phases, cope's position table, which starts at 0); the layer map
    arm trains RoPE in layers 0-2 and NoPE in layer 3."""
    import run
    from tokenizer import train_bpe

    from hf_posenc.train import modeling

    s = dataclasses.replace(run.SMOKE, layers=4)  # a 4th layer, as in the full study
    tokenizer = train_bpe(run.data.long_text("kjv")[:20_000], s.vocab, tmp_path / "tokenizer")
    ids = tokenizer("In the beginning God created the heaven and the earth.", return_tensors="pt").input_ids
    installed_by = {}
    for name, arm in run.arms(s.width, s.layers).items():
        init = run.init_model(arm, s, tokenizer, 0, tmp_path / name / "init")
        recipe = run.recipe_for(arm, s, init, 0, tmp_path / name / "run")
        model, _ = modeling.load_recipe_model(recipe)
        installed_by[name] = modeling.apply_posenc(model, recipe)
        model = modeling.select_trainable(model, recipe, installed_by[name])
        model(ids, labels=ids).loss.backward()
        untrained = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
        assert not untrained, f"{name}: no gradient reaches {untrained}"
        if name == "nope_every4":  # the map the init folder carries, GPT-2's learned table gone
            entries = run.hp.describe(model).entries
            assert [(e.scheme, e.layers) for e in entries] == [("rope", (0, 1, 2)), ("nope", (3,))]
            assert not any("wpe" in n for n, _ in model.named_parameters())
    assert all(installed_by[name] for name in ("t5", "pope", "cope")), installed_by


def test_the_readme_names_every_arm():
    import run

    readme = (REPO / "benchmarks" / "study" / "README.md").read_text()
    assert [name for name in run.arms(run.FULL.width, run.FULL.layers) if f"`{name}`" not in readme] == []


def test_an_unknown_arm_names_the_arms(tmp_path):
    import run

    with pytest.raises(run.hp.PosEncError, match="unknown arm.*the arms are learned, sinusoidal, concat_d8"):
        run.main(["--arms", "learned,fourier", "--out", str(tmp_path)])


def test_the_committed_study_is_what_the_readme_reports():
    """benchmarks/study/results.json has the issue's format, 3 seeds of every arm it holds at the full budget (the
    ten the docs' findings rest on at least; an arm added later joins when `run.py --arms` has run it), and the
    docs' "What we found" tables are results.md (docs/benchmarks/study.md includes it), which the run writes from it."""
    import run

    saved = json.loads((REPO / "benchmarks" / "study" / "results.json").read_text())
    s = run.FULL
    assert saved["settings"]["tokens_per_run"] == s.tokens and saved["settings"]["steps"] == s.steps
    ran = {r["arm"] for r in saved["runs"]}
    assert set(FIRST_ARMS) <= ran <= set(run.arms(s.width, s.layers))
    for arm in ran:
        assert sorted(r["seed"] for r in saved["runs"] if r["arm"] == arm) == list(s.seeds)
    for r in saved["runs"]:
        assert set(r) == {"arm", "seed", "tokens", "params", "metrics"} and r["tokens"] == s.tokens
    expected = run.summary(saved["runs"], s) + "\n" + run.geometry_summary(saved["runs"])
    assert (REPO / "benchmarks" / "study" / "results.md").read_text() == expected
    assert '<!-- posenc:include benchmarks/study/results.md -->' in (REPO / "docs" / "benchmarks" / "study.md").read_text()


def test_the_gpu_scale_trains_30x_the_cpu_tokens_on_a_wider_model_sized_by_throughput():
    """The gpu preset (issue 40): the seeds' core arms x 2 seeds, >= 30x the CPU scale's tokens per run whatever the
    throughput, more when a budget lets every run train more, and whole steps of a grid the checkpoints divide."""
    import scale

    gpu, cpu = scale.scale("gpu"), scale.scale("cpu")
    assert gpu.arms == ("learned", "sinusoidal", "concat_d8", "untied", "rope", "alibi", "nope", "p_rope")
    assert gpu.settings.seeds == (0, 1) and gpu.settings.width > cpu.settings.width
    assert gpu.settings.layers >= cpu.settings.layers and gpu.settings.seq_len >= cpu.settings.seq_len
    runs = len(gpu.arms) * len(gpu.settings.seeds)
    slow = scale.sized(gpu.settings, tokens_per_s=1e4, budget_s=240, runs=runs, sc=gpu)
    assert slow.tokens >= 30 * cpu.settings.tokens == 30 * 327_680
    assert slow.tokens == slow.steps * slow.batch_size * slow.seq_len and slow.steps % slow.checkpoints == 0
    fast = scale.sized(gpu.settings, tokens_per_s=1e8, budget_s=240, runs=runs, sc=gpu)
    assert fast.tokens >= 1e8 * 240 * scale.TRAIN_SHARE / runs > slow.tokens
    assert scale.sized(gpu.settings, 1e8, 0, runs, gpu).tokens == slow.tokens  # no budget: the floor
    # the dry run's tiny preset keeps the gpu scale's names and sizing, at the smoke size
    tiny = scale.scale("gpu", tiny=True)
    assert (tiny.stem, tiny.plots, tiny.work) == (gpu.stem, gpu.plots, gpu.work) and tiny.sized
    assert scale.sized(tiny.settings, 1e8, 240, 2, tiny).tokens <= tiny.cap_tokens


@pytest.mark.slow
def test_the_gpu_scale_writes_beside_the_cpu_results_and_a_rerun_continues_it(tmp_path, monkeypatch):
    """results_gpu.json / .md and study_gpu.png land in the same folder as the CPU scale's results.json and plots,
    which stay as they were; the sizing is recorded, and a rerun keeps it and the runs done (no new measurement)."""
    import run

    cpu_files = {"results.json": '{"runs": [], "settings": {}}', "results.md": "cpu", "study.png": "png"}
    for name, text in cpu_files.items():
        (tmp_path / name).write_text(text)
    assert run.main(["--scale", "gpu", "--tiny", "--arms", "rope", "--budget", "120", "--out", str(tmp_path)]) == 0
    assert {name: (tmp_path / name).read_text() for name in cpu_files} == cpu_files
    saved = json.loads((tmp_path / "results_gpu.json").read_text())
    assert [(r["arm"], r["seed"]) for r in saved["runs"]] == [("rope", 0)]
    assert saved["sizing"]["tokens_per_s"] > 0 and saved["sizing"]["tokens_per_run"] == saved["settings"]["tokens_per_run"]
    assert "| rope | 1 |" in (tmp_path / "results_gpu.md").read_text() and (tmp_path / "study_gpu.png").is_file()
    monkeypatch.setattr(run, "tokens_per_second", lambda *a, **k: pytest.fail("a rerun measured the throughput"))
    assert run.main(["--scale", "gpu", "--tiny", "--arms", "rope", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "results_gpu.json").read_text()) == saved
