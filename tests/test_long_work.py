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
    assert "eval: 4000 tokens (perplexity, passkey) is 62.5x the model's trained range (64 positions)" in err
    assert "the compute of the other lengths together" in err and "Ctrl-C stops it" in err
    assert "interrupted" in err and "the same command run again replaces" in err
    assert json.loads((out / folders.MARKER).read_text())["complete"] is False

    # the next mistake is the one reported, not the folder
    typo = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--perplexity.max-windows", "0", "--out",
                 str(out), cwd=tmp_path)
    assert typo.returncode == 2 and "--perplexity.max-windows" in typo.stderr and "not empty" not in typo.stderr, typo.stderr

    # the rerun takes its own incomplete folder back without --overwrite; a short run is not warned about
    rerun = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--out", str(out), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "trained range" not in rerun.stderr and "Ctrl-C stops it" not in rerun.stderr
    assert json.loads((out / folders.MARKER).read_text())["complete"] is True
    assert json.loads((out / "results.json").read_text())["complete"] is True

    # a finished folder is protected as before
    again = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "not empty" in again.stderr and "--overwrite" in again.stderr


def test_a_failed_run_leaves_a_folder_its_rerun_replaces(tiny, tmp_path, capsys):
    from hf_posenc import cli

    out = tmp_path / "out"
    small = ["eval", "--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--perplexity.max-windows", "1",
             "--out", str(out)]
    # a text that cannot be read offline fails after the folder was begun
    assert cli.main([*small, "--perplexity.text", "no-such-owner/no-such-dataset"]) != 0
    assert json.loads((out / folders.MARKER).read_text())["complete"] is False
    capsys.readouterr()
    assert cli.main(small) == 0  # the same command, fixed, without --overwrite
    assert json.loads((out / folders.MARKER).read_text())["complete"] is True


def _cells(out: Path) -> dict:
    """The cells results.json holds so far, by run label and table (empty before it is written or while it is)."""
    try:
        record = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return {}
    return {run["label"]: run.get("metrics", {}) for run in record.get("runs", [])}


def test_a_run_killed_mid_suite_leaves_its_cells_and_a_folder_its_rerun_replaces(tiny, tmp_path):
    out = tmp_path / "out"
    argv = ["--model", str(tiny), "--suite", "ppl,passkey", "--lengths", "16,4000,8000", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", "eval", *argv], cwd=tmp_path, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not any(metrics.get("perplexity") for metrics in _cells(out).values()) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no handler runs: what is on disk is all there is
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it was killed mid-suite"
    (cells,) = _cells(out).values()  # the model as loaded (not patched: no baseline)
    assert cells["perplexity"]["16"]["perplexity"] > 0 and "passkey" not in cells  # killed mid-suite
    assert json.loads((out / "results.json").read_text())["complete"] is False
    assert json.loads((out / folders.MARKER).read_text())["complete"] is False

    # the next mistake is the one reported, not the killed run's folder
    typo = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--dtype", "float8", "--out", str(out),
                 cwd=tmp_path)
    assert typo.returncode == 2 and "--dtype" in typo.stderr and "not empty" not in typo.stderr, typo.stderr
    fixed = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--out", str(out), cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert json.loads((out / "results.json").read_text())["complete"] is True
    assert "passkey" not in json.dumps(_cells(out))  # replaced, not mixed with the killed run's cells


BOOM = '''
"""`boom`: one cell, then the error a suite of one's own can raise half-way."""
from hf_posenc.evaluation.suite import Metric, Suite, register_suite


class Boom(Suite):
    name = "boom"
    help = "one cell, then an error"
    metrics = {"boom": Metric(("value",), "tokens")}

    def cells(self, scoring, settings, argument):
        yield "boom", scoring.lengths[0], {"value": 1.0}
        raise RuntimeError("boom after the first cell")


register_suite(Boom())
'''


def test_a_suite_that_raises_leaves_what_finished_and_says_how_to_rerun(tiny, tmp_path):
    (tmp_path / "boom.py").write_text(BOOM)
    out = tmp_path / "out"
    failed = _eval("--suite-module", str(tmp_path / "boom.py"), "--model", str(tiny), "--suite", "ppl,boom",
                   "--lengths", "16,32", "--perplexity.max-windows", "1", "--out", str(out), cwd=tmp_path)
    assert failed.returncode == 1 and "RuntimeError: boom after the first cell" in failed.stderr, failed.stderr
    assert f"the suites that finished are in {out / 'results.json'} (complete: false)" in failed.stderr
    assert "the same command run again replaces" in failed.stderr
    (cells,) = _cells(out).values()
    assert set(cells["perplexity"]) == {"16", "32"} and cells["boom"] == {"16": {"value": 1.0}}
    assert json.loads((out / "results.json").read_text())["complete"] is False

    rerun = _eval("--model", str(tiny), "--suite", "ppl", "--lengths", "16,32", "--perplexity.max-windows", "1", "--out",
                  str(out), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "boom" not in json.dumps(_cells(out)) and json.loads((out / folders.MARKER).read_text())["complete"]


def test_the_estimate_counts_every_row_the_eval_will_score(tiny, tmp_path, capsys):
    from hf_posenc import cli
    from hf_posenc.cli import eval_

    assert cli.main(["patch", str(tiny), "alibi", "--out", str(tmp_path / "patched")]) == 0
    counted = {}
    for name, model, extra in [("plain", tiny, []), ("patched", tmp_path / "patched", []),
                               ("alone", tmp_path / "patched", ["--no-baseline"])]:
        argv = ["eval", "--model", str(model), "--suite", "ppl", "--lengths", "16,4000", "--perplexity.max-windows", "2", *extra,
                "--out", str(tmp_path / "out")]
        args, _ = cli.build_parser(argv).parse_known_args(argv)
        capsys.readouterr()
        eval_.check(args)  # the checks and the announcement, before any model loads
        counted[name] = int(capsys.readouterr().err.split("eval: ", 1)[1].split(" row(s)")[0])
    # an untrained patched folder scores two rows (as loaded; its own weights unpatched, which are the original
    # it was patched from: one row); --no-baseline one
    assert counted == {"plain": 1, "patched": 2, "alone": 1}
