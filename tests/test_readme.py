"""Every shell command of README.md runs, so the README cannot rot.

The fenced ```bash blocks are read from README.md itself; each line runs in bash in one scratch
folder per block (in order: later lines read what earlier ones wrote), with tiny models standing in
for the packaged SmolLM2 and MiniLM, shorter lengths and fewer sentences for eval, and a tiny
dataset and 2 steps for the training data and length. A line this test neither runs nor skips with a reason fails it: a new command in
the README has to be covered here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train import REPO, tiny_assets

README = REPO / "README.md"
BIN = Path(sys.executable).parent  # hf-posenc and python of this environment

# line prefix -> why it does not run here
SKIPPED = {
    "make demo": "the demo on the real SmolLM2 takes minutes; its code path is tests/test_results.py's demo test",
    "make test": "is this test suite",
}


def shell_blocks() -> list[list[str]]:
    """The lines of each ```bash block: continuations joined, comments and blank lines dropped."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
    found = []
    for block in blocks:
        text = block.replace("\\\n", " ")
        lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in text.splitlines()]
        found.append([line for line in lines if line and not line.startswith("#")])
    return found


def tiny_stand_ins(line: str, assets: dict[str, dict[str, Path]]) -> str:
    """The same command on tiny models: package model names become tiny model folders, and a
    recipe gets the tiny model, data and 2 steps as ordinary recipe-field overrides."""
    line = re.sub(r"(?<=[ =])smollm2(?= |$)", str(assets["llama"]["model"]), line)
    line = re.sub(r"(?<=[ =])minilm(?= |$)", str(assets["bert"]["model"]), line)
    line = re.sub(r"--lengths \S+", "--lengths 64,512", line)  # a tiny model's lengths, same suites
    line = re.sub(r"--limit \d+", "--limit 40", line)
    # RULER: the tiny models' one-character tokens cannot fit vt's 500-token worked example (lm-eval's
    # generator never ends) and make the other generators slow; its two needle tasks, 2 samples each
    if "--suite ruler" in line:
        line = re.sub(r"--(samples|gen-tokens) \d+", "", line)
        line = re.sub(r"--suite ruler\S*", "--suite ruler:niah_single_1,niah_single_2 --samples 2 --gen-tokens 4", line)
    if line == "hf-posenc doctor":  # every family x every site is ~1 min; every family with one scheme here
        line += " --schemes nope"
    if line.startswith("hf-posenc inspect "):  # the default paragraph is longer than a tiny model's 64 positions
        line += " --text 'the cat sat on the mat.'"
    if re.search(r"\btrain (recipes/\S+\.yaml|[\w.-]+/[\w.-]+/[\w.-]+ )", line):  # a recipe path or shipped name
        line += (f" --model.name_or_path {assets['llama']['model']} --data.dataset {assets['llama']['data']}"
                 " --data.seq_len 32 --training.max_steps 2 --training.save_steps 0 --evaluation.perplexity_lengths 48")
    return line


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("readme-assets")
    return {kind: tiny_assets(root / kind, kind) for kind in ("llama", "bert")}


BLOCKS = shell_blocks()


def test_the_readme_has_the_blocks_this_test_knows():
    assert len(BLOCKS) >= 3 and any("cpu_2proc" in line for block in BLOCKS for line in block)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i}:{b[0][:30]}" for i, b in enumerate(BLOCKS)])
def test_readme_block_runs(index, assets, tmp_path):
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ran = 0
    for line in BLOCKS[index]:
        reason = next((why for prefix, why in SKIPPED.items() if line.startswith(prefix)), None)
        if reason:
            continue
        assert line.startswith(("hf-posenc ", "python ")), (
            f"README line not covered by tests/test_readme.py: {line!r}; map it to a tiny run or add it to SKIPPED")
        command = tiny_stand_ins(line, assets)
        start = time.perf_counter()
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        print(f"{time.perf_counter() - start:6.1f} s  {line}")
        assert proc.returncode == 0, f"{line}\n-> {command}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        ran += 1
    assert ran or all(any(line.startswith(p) for p in SKIPPED) for line in BLOCKS[index])


@pytest.mark.parametrize("table", ["recovery.md", "demo_variants.md"])
def test_recovery_tables_are_the_benchmarks(table):
    """The README's recovery tables are what benchmarks/recovery.py and demo_recovery.py wrote, verbatim."""
    written = (REPO / "benchmarks/results/recovery" / table).read_text()
    assert written in README.read_text(), f"paste benchmarks/results/recovery/{table} into the README"
