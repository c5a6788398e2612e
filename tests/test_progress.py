"""Progress you can see (issue 31): long work draws a bar with an estimate in a terminal -- also a pseudo-terminal
that reports 0 columns, where plain tqdm draws empty lines -- stays quiet in logs and pipes, and the package's own
calls cause no warnings."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_train import recipe_dict, tiny_assets

BIN = Path(sys.executable).parent
BAR = re.compile(r"(\S[^\r\n|]*): +\d+%\|[^|]*\| *\d+/\d+ \[\d\d:\d\d<\d\d:\d\d")  # desc: NN%|...| n/N [elapsed<estimate
WARNED = re.compile(r"Warning|deprecated", re.I)


def in_terminal(argv: list[str], cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """Run `argv` with stdout and stderr on a new pseudo-terminal (0 x 0, as `script` and many CI runners give)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise TimeoutError(" ".join(argv))
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(), b"".join(chunks).decode("utf-8", "replace")


def bars(output: str) -> set[str]:
    return {m.group(1).strip() for m in BAR.finditer(output)}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("progress")
    data = recipe_dict(tiny_assets(root / "assets"), root / "run", max_steps=4, perplexity_lengths=[32])
    (root / "recipe.yaml").write_text(yaml.safe_dump(data))
    return root / "recipe.yaml"


def test_train_draws_bars_with_estimates_in_a_zero_column_terminal(recipe):
    code, out = in_terminal([str(BIN / "hf-posenc"), "train", str(recipe), "--output_dir", "run-tty"], recipe.parent)
    assert code == 0, out[-2000:]
    assert {"train", "held-out: swapped, before step 1 (start)",
            "held-out: after training"} <= bars(out), out[-2000:]
    assert "4/4 [" in out and not WARNED.search(out), out[-2000:]


def test_train_is_quiet_in_a_pipe(recipe):
    proc = subprocess.run([str(BIN / "hf-posenc"), "train", str(recipe), "--output_dir", "run-pipe"], cwd=recipe.parent,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not bars(proc.stdout + proc.stderr) and "%|" not in proc.stderr
    assert not WARNED.search(proc.stdout + proc.stderr), proc.stderr[-2000:]


@pytest.mark.slow
def test_the_demo_shows_every_long_piece_of_work(tmp_path):
    assets = tiny_assets(tmp_path / "assets")
    code, out = in_terminal([str(BIN / "hf-posenc"), "demo", "--model", str(assets["model"]), "--steps", "3",
                             "--lengths", "128", "--out", "demo"], tmp_path)
    assert code == 0, out[-2000:]
    assert {"train", "held-out: after training", "model alibi: perplexity @ 128"} <= bars(out), out[-3000:]
    assert not WARNED.search(out), out[-3000:]
