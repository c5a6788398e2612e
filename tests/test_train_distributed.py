"""Real multi-process and crash/resume runs of the recipe runner (no mocks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import REPO, recipe_dict, run_cli, tiny_assets, write_recipe

from hf_posenc import results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    return tiny_assets(tmp_path_factory.mktemp("tiny"))


def _hf_posenc_train(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    code = "import sys; from hf_posenc.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "train", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the workers it started
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def train_in_one_and_two_processes(tmp_path: Path, assets: dict, fields: dict) -> None:
    """The same recipe trained in one process (into tmp_path/one) and in two gloo processes (tmp_path/two)."""
    one = write_recipe(tmp_path / "one.yaml", recipe_dict(assets, tmp_path / "one", **fields))
    two = write_recipe(tmp_path / "two.yaml", recipe_dict(assets, tmp_path / "two", **fields))
    proc = run_cli([str(one)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _hf_posenc_train([str(two), "--accelerate-config", "cpu_2proc"])
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_two_processes_match_one_at_the_same_global_batch(tmp_path, assets):
    # dropout on the LoRA path makes the random streams matter: keep it off so the curves can match
    common = {"max_steps": 5, "global_batch_size": 4, "per_device_train_batch_size": 1,
              "perplexity_lengths": [16, 48], "eval_max_windows": 3}  # 3 windows: split 2 + 1
    train_in_one_and_two_processes(tmp_path, assets, common)

    r1 = results.load(tmp_path / "one" / "results.json").details
    r2 = results.load(tmp_path / "two" / "results.json").details
    run2 = json.loads((tmp_path / "two" / "run.json").read_text())
    # proof that two processes took part, each on half of every global batch
    assert r2["world_size"] == 2 and run2["distributed_type"] == "DistributedType.MULTI_CPU"
    assert run2["backend"] == "gloo"
    assert r2["samples_per_rank"] == [10, 10] and r1["samples_per_rank"] == [20]
    loss1 = [r["loss"] for r in json.loads((tmp_path / "one" / "loss.json").read_text())]
    loss2 = [r["loss"] for r in json.loads((tmp_path / "two" / "loss.json").read_text())]
    assert len(loss1) == len(loss2) == 5
    torch.testing.assert_close(torch.tensor(loss2), torch.tensor(loss1), rtol=1e-4, atol=1e-5)
    assert loss1[-1] < loss1[0]
    # held-out perplexity, its windows split over the processes: before training the models are the same
    runs1 = {run.label: run.metrics["perplexity"] for run in results.load(tmp_path / "one" / "results.json").runs}
    runs2 = {run.label: run.metrics["perplexity"] for run in results.load(tmp_path / "two" / "results.json").runs}
    assert runs1.keys() == runs2.keys() == {"original", "before training", "after training"}
    for label, table in runs1.items():
        assert table.keys() == runs2[label].keys() == {"16", "32", "48"}
        for length, cell in table.items():
            rel = 1e-6 if label != "after training" else 1e-3
            assert runs2[label][length]["loss"] == pytest.approx(cell["loss"], rel=rel), (label, length)
    w1 = load_file(tmp_path / "one" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "model.safetensors")
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-5)


def _kill_after_checkpoint(args: list[str], out: Path, step: int) -> None:
    """Start a run and SIGKILL it while it writes the checkpoint after `step` (or just after)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", "train", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = out / "checkpoints"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            names = os.listdir(root) if root.is_dir() else []
            if f"checkpoint-{step}" in names:  # Trainer's folder, being written
                break
            time.sleep(0.001)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_then_resume_equals_uninterrupted(tmp_path, assets):
    fields = {"max_steps": 8, "save_strategy": "steps", "save_steps": 2, "save_total_limit": 2, "full_determinism": True,
              "lora_dropout": 0.1}  # the RNG stream must be restored too, not only the weights
    full = write_recipe(tmp_path / "full.yaml", recipe_dict(assets, tmp_path / "full", **fields))
    cut = write_recipe(tmp_path / "cut.yaml", recipe_dict(assets, tmp_path / "cut", **fields))
    proc = run_cli([str(full)])
    assert proc.returncode == 0, proc.stderr[-3000:]

    _kill_after_checkpoint([str(cut)], tmp_path / "cut", step=4)
    # whatever the kill interrupted, every listed checkpoint is complete and a resume picks the latest
    from hf_posenc.train.run_folder import checkpoints

    kept = checkpoints(tmp_path / "cut")
    # a LoRA run's checkpoint holds its adapter (with the groups trained in full, peft's modules_to_save)
    assert kept and all((p / "adapter_model.safetensors").is_file() and (p / "trainer_state.json").is_file()
                        for p in kept)
    assert int(kept[-1].name.split("-")[1]) in (2, 4)

    refused = run_cli([str(cut)])
    assert refused.returncode == 2 and "already holds a run" in refused.stderr
    proc = run_cli([str(cut), "--resume"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "cut" / "run.json").read_text())
    assert run["resumed_from"] == str(kept[-1])

    a = load_file(tmp_path / "full" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    la = json.loads((tmp_path / "full" / "loss.json").read_text())
    lb = json.loads((tmp_path / "cut" / "loss.json").read_text())
    assert [r["loss"] for r in la] == [r["loss"] for r in lb]
    assert [p.name for p in checkpoints(tmp_path / "cut")] == ["checkpoint-6", "checkpoint-8"]  # Trainer saves the last step too


def test_interrupted_save_leaves_latest_good_checkpoint(tmp_path, assets):
    cut = write_recipe(tmp_path / "cut.yaml", recipe_dict(assets, tmp_path / "cut", max_steps=8, save_strategy="steps",
                                                          save_steps=2))
    _kill_after_checkpoint([str(cut)], tmp_path / "cut", step=6)
    from hf_posenc.train.run_folder import checkpoints

    root = tmp_path / "cut" / "checkpoints"
    # simulate the worst case too: a save killed half way leaves a folder with partial files and no state file
    partial = root / "checkpoint-8"
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    latest = checkpoints(tmp_path / "cut")[-1]
    assert latest.name in ("checkpoint-4", "checkpoint-6")
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["global_step"] == int(latest.name.split("-")[1])
    load_file(latest / "adapter_model.safetensors")  # readable, not truncated
    proc = run_cli([str(cut), "--resume"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results.load(tmp_path / "cut" / "results.json").details["steps"] == 8


def test_accelerate_launch_of_the_module_runs_what_hf_posenc_train_runs(tmp_path, assets):
    """`accelerate launch --config_file CFG -m hf_posenc.train --config RECIPE` (TRL's form, typed by hand) trains
    as `hf-posenc train RECIPE` does: the same losses and weights; without --config it says what it needs."""
    recipe = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, tmp_path / "cli", max_steps=3))
    proc = run_cli([str(recipe)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = REPO / "hf_posenc" / "accelerate_configs" / "cpu.yaml"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    launched = subprocess.run([str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(config),
                               "-m", "hf_posenc.train", "--config", str(recipe), "--output_dir", str(tmp_path / "hand")],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert launched.returncode == 0, launched.stderr[-3000:]
    losses = [[row["loss"] for row in json.loads((tmp_path / name / "loss.json").read_text())] for name in ("cli", "hand")]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in ("cli", "hand"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    bare = subprocess.run([sys.executable, "-m", "hf_posenc.train", str(recipe)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "--config RECIPE.yaml" in bare.stderr, bare.stderr
