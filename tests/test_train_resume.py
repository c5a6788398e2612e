"""Interrupting and resuming a run, as a user meets it (issue 61, "resume dead end"): the real command in a real
process, stopped by a real signal, then the command its message names."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from test_train import REPO, recipe_dict, run_cli, tiny_assets, write_recipe

from hf_posenc import folders, results
from hf_posenc.train.run_folder import checkpoints

pytestmark = pytest.mark.slow
STEPS = 200  # a few seconds of steps: the signal comes after the third, long before the last


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    return tiny_assets(tmp_path_factory.mktemp("tiny"))


def interrupt(args: list[str], logs: Path, signum: int) -> subprocess.CompletedProcess:
    """`hf-posenc train ARGS` sent `signum` once it has logged three training steps; ends when the process does."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}
    out, err = logs.with_suffix(".out"), logs.with_suffix(".err")
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", "train", *args], cwd=REPO, env=env,
                                stdout=stdout, stderr=stderr)
        deadline = time.monotonic() + 240
        while out.read_text().count("'loss'") < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before the signal: {err.read_text()[-2000:]}"
        proc.send_signal(signum)
        proc.wait(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())


def run_named(stderr: str, way: str) -> subprocess.CompletedProcess:
    """Run the `hf-posenc train ...` line that the message in `stderr` names after `way` ("continue with: ")."""
    (line,) = re.findall(rf"{way}(hf-posenc train .*)$", stderr, flags=re.M)
    argv = shlex.split(line)
    assert argv[:2] == ["hf-posenc", "train"]
    return run_cli(argv[2:])


def test_a_run_that_saves_no_checkpoint_is_started_again_by_its_command_after_ctrl_c(tmp_path, assets):
    """save_strategy "no", Ctrl-C: the rerun said "pass --resume", and --resume "run without --resume", a loop; now
    the message names the command that starts it again, --resume names it too, and a finished run stays."""
    out = tmp_path / "out"
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, out, max_steps=STEPS, save_strategy="no"))
    stopped = interrupt([str(path)], tmp_path / "stopped", signal.SIGINT)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert f"interrupted (SIGINT); no checkpoint was saved; start the run again with: hf-posenc train {path}\n" \
        in stopped.stderr and "Traceback" not in stopped.stderr
    assert not checkpoints(out) and folders.incomplete(out, "train")
    run_file = (out / "run.json").read_text()

    refused = run_cli([str(path), "--resume"])
    assert refused.returncode == 2
    assert "--resume: " in refused.stderr and "no checkpoint to continue from; run without --resume to start it " \
        "over" in refused.stderr
    assert (out / "run.json").read_text() == run_file  # the refusal changed nothing

    again = run_named(stopped.stderr, "start the run again with: ")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "loss.json").read_text())[-1]["step"] == STEPS
    assert not folders.incomplete(out, "train")

    for flags in ([], ["--resume", "auto"]):  # a finished run is never started over unasked
        kept = run_cli([str(path), *flags])
        assert kept.returncode == 2 and "no checkpoint to continue from; pass --overwrite to replace it" \
            in kept.stderr, kept.stderr
        assert (out / "results.json").is_file()


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_save_a_checkpoint_and_name_the_command_that_continues(tmp_path, assets, signum, status):
    """Ctrl-C named the checkpoint but saved none; SIGTERM said nothing (exit 143). Both now end the step under way,
    save it (here the only checkpoint: save_steps lies past the end) and name the resume command, which finishes."""
    out = tmp_path / "out"
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, out, max_steps=STEPS, save_strategy="steps",
                                                        save_steps=10 * STEPS))
    stopped = interrupt([str(path), "--learning_rate", "2e-3"], tmp_path / "stopped", signum)
    assert stopped.returncode == status, stopped.stderr[-3000:]
    (saved,) = checkpoints(out)
    assert 3 <= int(saved.name.split("-")[1]) < STEPS
    name = signal.Signals(signum).name
    assert stopped.stderr.count("interrupted") == 1 and "Traceback" not in stopped.stderr
    assert f"interrupted ({name}); the latest checkpoint is {saved}; continue with: hf-posenc train {path} " \
           "--learning_rate 2e-3 --resume\n" in stopped.stderr
    assert folders.incomplete(out, "train") and not (out / "results.json").exists()  # never marked finished

    resumed = run_named(stopped.stderr, "continue with: ")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "missing keys" not in resumed.stdout + resumed.stderr
    assert json.loads((out / "run.json").read_text())["resumed_from"] == str(saved)
    assert [row["step"] for row in json.loads((out / "loss.json").read_text())] == list(range(1, STEPS + 1))
    assert not folders.incomplete(out, "train")


def test_sigterm_to_a_launch_stops_its_processes_at_a_checkpoint_and_names_the_launch_that_continues(tmp_path, assets):
    """`--accelerate-config cpu_2proc` sent SIGTERM: torchrun passes it on to both processes, which stop after the
    same step and save it, silently (they cannot name the config); the launching process names the command, config
    and all, and exits 143 (accelerate's launcher exited without a word)."""
    out, steps = tmp_path / "out", 40
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(assets, out, max_steps=steps, save_strategy="steps",
                                                        save_steps=10 * steps, eval_before=False))
    stopped = interrupt([str(path), "--accelerate-config", "cpu_2proc"], tmp_path / "stopped", signal.SIGTERM)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    (saved,) = checkpoints(out)
    assert stopped.stderr.count("interrupted") == 1 and "Traceback" not in stopped.stderr
    assert f"interrupted (SIGTERM); the latest checkpoint is {saved}; continue with: hf-posenc train {path} " \
           "--accelerate-config cpu_2proc --resume\n" in stopped.stderr

    resumed = run_named(stopped.stderr, "continue with: ")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["resumed_from"] == str(saved)
    assert [row["step"] for row in json.loads((out / "loss.json").read_text())] == list(range(1, steps + 1))


def test_a_tied_head_resumes_silently_and_a_key_really_missing_is_named(tmp_path):
    """GPT-2 ties its head to its embedding, so save_pretrained leaves `lm_head.weight` out of every checkpoint, and
    Trainer said it was missing at every resume of a full fine-tuning; a key the checkpoint really lacks still shows."""
    assets = tiny_assets(tmp_path / "tiny", "gpt2")
    out = tmp_path / "out"
    path = write_recipe(tmp_path / "r.yaml", recipe_dict(
        assets, out, scheme="rope", use_peft=False, max_steps=2, save_strategy="steps", save_steps=1,
        eval_original=False, eval_before=False, eval_after=False, save_model=False))
    assert run_cli([str(path)]).returncode == 0
    assert "lm_head.weight" not in load_file(checkpoints(out)[-1] / "model.safetensors")  # tied: left out

    # Trainer's evaluation fields may change on a resume, as the project's eval_* fields may
    resumed = run_cli([str(path), "--resume", "--max_steps", "3", "--eval_strategy", "steps", "--eval_steps", "1"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "missing keys" not in resumed.stdout + resumed.stderr
    assert [row["step"] for row in results.load(out / "results.json").details["curve"]] == [3]

    weights = checkpoints(out)[-1] / "model.safetensors"
    kept = load_file(weights)
    del kept["transformer.ln_f.weight"]
    save_file(kept, weights, metadata={"format": "pt"})
    damaged = run_cli([str(path), "--resume", "--max_steps", "4"])
    assert damaged.returncode == 0, damaged.stderr[-3000:]
    assert "There were missing keys in the checkpoint model loaded: ['transformer.ln_f.weight']" \
        in damaged.stdout + damaged.stderr
