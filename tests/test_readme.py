"""Every shell command and Python block of README.md and of the docs site runs, so neither can rot.

The fenced ```bash and ```python blocks are read from README.md and docs/**/*.md themselves (the pages with
tests of their own, `OWN_TESTS`, excepted); a block that appears on two pages runs once, and a shell block
whose lines begin another block runs as part of that one. Each shell line runs in bash in one scratch folder
per block (in order: later lines read what earlier ones wrote), with tiny models standing in for the
packaged SmolLM2 and MiniLM, shorter lengths and fewer sentences for eval, and a tiny dataset and 2 steps for
the training data and length. A line this test neither runs nor skips with a reason fails it: a new command
in the README or the docs has to be covered here. Each Python block runs in a fresh interpreter in a scratch
folder, with the same tiny models standing in for the Hub ids it names and tiny models built for the
variables it takes as given (`PYTHON_GIVEN`).
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
DOCS = REPO / "docs"
# docs pages whose blocks other tests run as written
OWN_TESTS = {"extending.md": "tests/test_extending.py", "with_other_tools.md": "tests/test_lm_eval.py, tests/test_trl.py"}
BIN = Path(sys.executable).parent  # hf-posenc and python of this environment

# line prefix -> why it does not run here
SKIPPED = {
    "make demo": "the demo on the real SmolLM2 takes minutes; its code path is tests/test_results.py's demo test",
    "make test": "is this test suite",
    "make gpu-kit": "tests/test_gpu_kit.py builds the kit (scripts/gpu_kit.py) for its rehearsal",
    "make gpu-rehearsal": "runs tests/test_gpu_kit.py, which is part of this suite",
    "python3 scripts/gpu-check": "tests/test_gpu_kit.py runs it with --dry-run in a venv of the GPU machine's packages",
}


def pages() -> list[Path]:
    """README.md and every page of the docs site whose blocks run here."""
    docs = sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).as_posix() not in OWN_TESTS)
    return [README, *docs]


def fenced(language: str) -> list[tuple[str, str]]:
    """(page, text) of each ```language block, each distinct text once (its first page)."""
    found: dict[str, str] = {}
    for page in pages():
        for block in re.findall(rf"^```{language}\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M):
            found.setdefault(block, page.relative_to(REPO).as_posix())
    return [(page, block) for block, page in found.items()]


def shell_blocks() -> list[tuple[str, list[str]]]:
    """(page, lines) of each ```bash block: continuations joined, comments and blank lines dropped; a block
    whose lines begin a longer block is left to that one."""
    found = []
    for page, block in fenced("bash"):
        text = block.replace("\\\n", " ")
        lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in text.splitlines()]
        found.append((page, [line for line in lines if line and not line.startswith("#")]))
    return [(page, lines) for page, lines in found
            if not any(len(other) > len(lines) and other[:len(lines)] == lines for _, other in found)]


def tiny_stand_ins(line: str, assets: dict[str, dict[str, Path]]) -> str:
    """The same command on tiny models: package model names become tiny model folders, and a
    recipe gets the tiny model, data and 2 steps as ordinary recipe-field overrides."""
    line = re.sub(r"(?<=[ =])smollm2(?= |$)", str(assets["llama"]["model"]), line)
    line = re.sub(r"(?<=[ =])minilm(?= |$)", str(assets["bert"]["model"]), line)
    line = re.sub(r"--lengths \S+", "--lengths 64,512", line)  # a tiny model's lengths, same suites
    line = re.sub(r"--sentiment.limit \d+", "--sentiment.limit 40", line)
    # RULER: the tiny models' one-character tokens cannot fit vt's 500-token worked example (lm-eval's
    # generator never ends) and make the other generators slow; its two needle tasks, 2 samples each
    if "--suite ruler" in line:
        line = re.sub(r"--ruler\.(samples|gen-tokens) \d+", "", line)
        line = re.sub(r"--suite ruler\S*", "--suite ruler:niah_single_1,niah_single_2 --ruler.samples 2 --ruler.gen-tokens 4", line)
    if line == "hf-posenc doctor":  # every family x every site is ~1 min; every family with one scheme here
        line += " --schemes nope"
    if line.startswith("hf-posenc inspect "):  # the default paragraph is longer than a tiny model's 64 positions
        line += " --text 'the cat sat on the mat.'"
    # a recipe path or shipped name, after `hf-posenc train` or `-m hf_posenc.train --config`
    if re.search(r"\btrain (--config )?(recipes/\S+\.yaml|[\w.-]+/[\w.-]+/[\w.-]+)( |$)", line):
        line += (f" --model_name_or_path {assets['llama']['model']} --dataset_name {assets['llama']['data']}"
                 " --seq_len 32 --max_steps 2 --save_strategy no --perplexity_lengths 48")
    return line


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("readme-assets")
    return {kind: tiny_assets(root / kind, kind) for kind in ("llama", "bert")}


BLOCKS = shell_blocks()


def test_the_pages_have_the_blocks_this_test_knows():
    assert len(BLOCKS) >= 3 and any("cpu_2proc" in line for _, block in BLOCKS for line in block)
    assert any(page == "README.md" for page, _ in PYTHON_BLOCKS), "the README's example is no longer a python block"


def block_id(page: str, first: str) -> str:
    return f"{page.removeprefix('docs/')}:{first[:30]}"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[block_id(p, b[0]) for p, b in BLOCKS])
def test_shell_block_runs(index, assets, tmp_path):
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    page, lines = BLOCKS[index]
    ran = 0
    for line in lines:
        reason = next((why for prefix, why in SKIPPED.items() if line.startswith(prefix)), None)
        if reason:
            continue
        assert line.startswith(("hf-posenc ", "python ", "accelerate launch ")), (
            f"{page} line not covered by tests/test_readme.py: {line!r}; map it to a tiny run or add it to SKIPPED")
        command = tiny_stand_ins(line, assets)
        start = time.perf_counter()
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        print(f"{time.perf_counter() - start:6.1f} s  {line}")
        assert proc.returncode == 0, f"{line}\n-> {command}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        ran += 1
    assert ran or all(any(line.startswith(p) for p in SKIPPED) for line in lines)


PYTHON_BLOCKS = fenced("python")
# Hub ids the blocks load -> the tiny asset that stands in for it
# (tests/test_unpacked.py runs the README's example on the real packaged SmolLM2, offline)
PYTHON_STAND_INS = {"HuggingFaceTB/SmolLM2-135M": "llama", "smollm2": "llama"}
# names a block uses as given (a model the reader already has) -> the code that builds a tiny one
_SEQ2SEQ = ("import importlib.util as _u; _s = _u.spec_from_file_location('seq2seq_catalog', "
            f"{str(REPO / 'benchmarks' / 'seq2seq_catalog.py')!r}); _c = _u.module_from_spec(_s); _s.loader.exec_module(_c)")
PYTHON_GIVEN = {
    "hp": "import hf_posenc as hp",
    "t5": f"{_SEQ2SEQ}; t5 = _c.build('t5')",
    "bart": f"{_SEQ2SEQ}; bart = _c.build('bart')",
    "whisper": f"{_SEQ2SEQ}; whisper = _c.build('whisper')",
    "voxtral": f"{_SEQ2SEQ}; voxtral = _c.build('voxtral')",
}


def python_program(block: str, assets: dict[str, dict[str, Path]]) -> str:
    """The block, with tiny folders for the Hub ids it loads and the given names it does not define first."""
    for hub_id, kind in PYTHON_STAND_INS.items():
        block = block.replace(f'"{hub_id}"', repr(str(assets[kind]["model"])))
    defined = (set(re.findall(r"^\s*(\w+)\s*=", block, flags=re.M)) | set(re.findall(r"\bas\s+(\w+)", block))
               | set(re.findall(r"^\s*(?:from\s+\S+\s+)?import\s+(\w+)", block, flags=re.M)))
    prelude = [code for name, code in PYTHON_GIVEN.items()
               if name not in defined and re.search(rf"\b{name}\b", block)]
    return "\n".join([*prelude, block])


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)),
                         ids=[block_id(p, b.strip().splitlines()[0]) for p, b in PYTHON_BLOCKS])
def test_python_block_runs(index, assets, tmp_path):
    page, block = PYTHON_BLOCKS[index]
    program = python_program(block, assets)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    print(f"{time.perf_counter() - start:6.1f} s  {page}")
    assert proc.returncode == 0, f"{page}:\n{program}\n{proc.stderr[-3000:]}"
