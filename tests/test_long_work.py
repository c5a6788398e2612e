"""Long work announced, and what an interrupted run leaves, as the new user met them: `--lengths 128,99999` (a typo)
ran 11 minutes with no word, and the partial folder it left blocked that `--out` and hid the next two mistakes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train import tiny_assets

from hf_posenc import folders

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _eval(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", "eval", *argv], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_assets(tmp_path_factory.mktemp("long-work"), "llama")["model"]  # 64 trained positions


def test_a_long_length_is_announced_and_an_interrupted_run_is_replaced_by_its_rerun(tiny, tmp_path):
    out = tmp_path / "out"
    long_run = [sys.executable, "-m", "hf_posenc.cli", "eval", "--model", str(tiny), "--suite", "ppl,passkey",
                "--lengths", "16,4000", "--out", str(out)]
    proc = subprocess.Popen(long_run, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while not (out / folders.MARKER).is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # the user's Ctrl-C, once the run has begun writing its folder
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    # announced before the model loaded: the estimate and how to stop
    assert "eval: --lengths 4000 is 62.5x the model's trained range (64 positions)" in err
    assert "the compute of the other lengths together" in err and "Ctrl-C stops it" in err
    assert "interrupted" in err and "the same command run again replaces" in err
    assert json.loads((out / folders.MARKER).read_text())["complete"] is False

    # the next mistake is the one reported, not the folder
    typo = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--max-windows", "0", "--out",
                 str(out), cwd=tmp_path)
    assert typo.returncode == 2 and "--max-windows" in typo.stderr and "not empty" not in typo.stderr, typo.stderr

    # the rerun takes its own incomplete folder back without --overwrite; a short run is not announced
    rerun = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--out", str(out), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "eval: --lengths" not in rerun.stderr
    assert json.loads((out / folders.MARKER).read_text())["complete"] is True
    assert json.loads((out / "results.json").read_text())["complete"] is True

    # a finished folder is protected as before
    again = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "not empty" in again.stderr and "--overwrite" in again.stderr


def test_a_failed_run_leaves_a_folder_its_rerun_replaces(tiny, tmp_path, capsys):
    from hf_posenc import cli

    out = tmp_path / "out"
    small = ["eval", "--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--max-windows", "1",
             "--out", str(out)]
    # a text that cannot be read offline fails after the folder was begun
    assert cli.main([*small, "--text", "no-such-owner/no-such-dataset"]) != 0
    assert json.loads((out / folders.MARKER).read_text())["complete"] is False
    capsys.readouterr()
    assert cli.main(small) == 0  # the same command, fixed, without --overwrite
    assert json.loads((out / folders.MARKER).read_text())["complete"] is True
