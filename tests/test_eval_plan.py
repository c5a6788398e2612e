"""What `eval` says while it works (issue 61), as a new user met it: an untrained patched folder scored twice (its
own weights with RoPE put back, then the original: the same weights, a third of a 13-minute run), nothing said up
front about rows or time, nothing at all until the table when piped, bars that did not say which row they were
for, and a warning about `--lengths` on a suite that never reads them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_progress import BIN, bars, in_terminal
from test_train import tiny_assets

from hf_posenc import cli
from hf_posenc.cli import eval_

REPO = Path(__file__).resolve().parents[1]
CELL_LINE = re.compile(r"^eval: (.+): (perplexity|passkey) @ (\d+) tokens: .+ \(\d+ s\)$", re.M)


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", *argv], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny model and an untrained patched folder made from it by `hf-posenc patch`."""
    root = tmp_path_factory.mktemp("eval-plan")
    model = tiny_assets(root, "llama")["model"]
    patched = root / "patched"
    made = _cli("patch", str(model), "alibi", "--out", str(patched), cwd=root)
    assert made.returncode == 0, made.stderr[-2000:]
    return {"root": root, "model": model, "patched": patched}


def test_a_piped_eval_announces_its_plan_scores_identical_weights_once_and_logs_each_cell(folders, tmp_path):
    out = tmp_path / "out"
    proc = _cli("eval", "--model", str(folders["patched"]), "--suite", "ppl,passkey", "--lengths", "16,32",
                "--perplexity.max-windows", "1", "--passkey.trials", "1", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    own, same = "patched (as loaded)", "patched (its own weights, rope positions) = model (original model)"
    # the plan, before anything loads: two rows (not three), each suite's cells, an estimate
    plan = proc.stderr.split("\n")
    head = next(i for i, line in enumerate(plan) if line.startswith("eval: 2 row(s) x 4 cell(s)"))
    assert "perplexity: 2 cells at ~16, 32 tokens" in plan[head] and "on 2 CPU cores" in plan[head], plan[head]
    assert plan[head + 1:head + 3] == [f"  {own}", f"  {same}"], proc.stderr[-3000:]
    # one line a cell, in the order scored, each naming its row
    cells = [(m.group(1), m.group(2), int(m.group(3))) for m in CELL_LINE.finditer(proc.stderr)]
    assert cells == [(row, suite, length) for row in (own, same) for suite in ("perplexity", "passkey")
                     for length in (16, 32)], proc.stderr[-3000:]
    assert proc.stderr.index(plan[head]) < proc.stderr.index(f"eval: {own}: perplexity @ 16")
    # the record: two runs, no duplicate, and the original really is the untrained folder's own weights
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [run["label"] for run in runs] == [own, same]
    original = _cli("eval", "--model", str(folders["model"]), "--suite", "ppl", "--lengths", "16,32",
                    "--perplexity.max-windows", "1", "--out", str(tmp_path / "original"), cwd=tmp_path)
    assert original.returncode == 0, original.stderr[-3000:]
    alone = json.loads((tmp_path / "original" / "results.json").read_text())["runs"][0]
    assert alone["metrics"]["perplexity"] == runs[1]["metrics"]["perplexity"]
    assert runs[0]["metrics"]["perplexity"] != runs[1]["metrics"]["perplexity"]  # the patch did change the model


def test_a_trained_folder_keeps_three_rows(folders, tmp_path, capsys):
    """Only an untrained patch is its original: a folder with other weights is announced with three rows (the
    plan is checked torch-free, before any model loads)."""
    trained = tmp_path / "trained"
    trained.mkdir()
    for item in folders["patched"].iterdir():
        if item.is_file() and item.name != ".hf-posenc.json":
            (trained / item.name).write_bytes(item.read_bytes())
    (trained / "run.json").write_text(json.dumps({"recipe": {"model_name_or_path": str(folders["model"])}}))
    argv = ["eval", "--model", str(trained), "--suite", "ppl", "--lengths", "16,32", "--out", str(tmp_path / "o")]
    args = cli.build_parser(argv).parse_args(argv)
    eval_.check(args)
    err = capsys.readouterr().err
    assert "eval: 3 row(s) x 2 cell(s)" in err, err
    assert "  trained (its own weights, rope positions)\n  model (original model)" in err, err


def test_warnings_only_for_lengths_a_chosen_suite_reads(folders, tmp_path, capsys):
    """The default --lengths (512, 1024, 2048) are 8-32x the tiny model's 64 positions: a lengthgen-only eval
    never reads them and is not warned; a perplexity eval is, naming the suite."""
    def plan(*suite: str) -> str:
        argv = ["eval", "--model", str(folders["model"]), *suite, "--out", str(tmp_path / "o")]
        eval_.check(cli.build_parser(argv).parse_args(argv))
        return capsys.readouterr().err

    lengthgen = plan("--suite", "lengthgen", "--lengthgen.symbol-lengths", "3,5", "--lengthgen.shots", "0")
    assert "lengthgen: 8 cells at ~16, 24 tokens" in lengthgen and "trained range" not in lengthgen, lengthgen
    assert "512" not in lengthgen and "--lengths" not in lengthgen, lengthgen
    ppl = plan("--suite", "ppl,lengthgen")
    assert "eval: 2048 tokens (perplexity) is 32.0x the model's trained range (64 positions)" in ppl, ppl


def test_bars_in_a_terminal_are_named_by_row(folders, tmp_path):
    code, out = in_terminal([str(BIN / "hf-posenc"), "eval", "--model", str(folders["patched"]), "--suite", "ppl",
                             "--lengths", "16", "--perplexity.max-windows", "1", "--out", "tty"], tmp_path)
    assert code == 0, out[-3000:]
    # 80 columns (the fallback of a 0 x 0 terminal): a long row name is shortened, the cell kept whole
    named = bars(out)
    assert "patched (as loaded): perplexity @ 16" in named, out[-3000:]
    assert any(b.startswith("patched (its own") and b.endswith("…: perplexity @ 16") for b in named), named
    assert not CELL_LINE.search(out)  # the bars are the progress there: no per-cell log lines besides them
