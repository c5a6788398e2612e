"""The tree of transformers' own model tests (built by ../shared/transformers-tests/setup.sh) and one pytest run in it.

Each run is a child process in the tree (its rootdir, its `tests` package), with this worktree's hf_posenc first
on the path, one torch thread per process, the plugin loaded, and an address-space cap: a wrong config can make a
save/reload test build a 7B model, and the cap turns that into a MemoryError instead of a swapping machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = Path(__file__).resolve().parent / "plugin"
PROBE = Path(__file__).resolve().with_name("probe.py")
MEMORY_CAP = 8_000_000 * 1024  # bytes: `ulimit -v 8000000` (KiB)


def kit() -> Path:
    """The transformers-tests kit: ../shared next to the repository (read-only in CI), or HF_POSENC_TESTS_KIT."""
    return Path(os.environ.get("HF_POSENC_TESTS_KIT", ROOT.parent / "shared" / "transformers-tests"))


def tree_dir() -> Path:
    """Where the tree is built: HF_POSENC_TRANSFORMERS_TESTS, else out/hf-tests (git-ignored)."""
    return Path(os.environ.get("HF_POSENC_TRANSFORMERS_TESTS", ROOT / "out" / "hf-tests"))


def stamp() -> str:
    """What the built tree depends on: the transformers version and the kit's setup script."""
    script = hashlib.sha256((kit() / "setup.sh").read_bytes()).hexdigest()[:16]
    return f"transformers {importlib.metadata.version('transformers')} setup.sh {script}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One builder at a time (two pytest workers may both ask for the tree)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(dest: Path | None = None) -> tuple[Path, float]:
    """The tree, built with setup.sh unless a tree for this transformers and kit is there; (path, seconds spent)."""
    dest = dest or tree_dir()
    start = time.monotonic()
    with locked(dest.parent / f".{dest.name}.lock"):
        marker = dest / ".hf_posenc_stamp"
        if not (marker.is_file() and marker.read_text() == stamp()):
            subprocess.run(["bash", str(kit() / "setup.sh"), str(dest)], check=True, capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable})
            marker.write_text(stamp())
    return dest, time.monotonic() - start


def child_env(tree: Path, cells: list[dict[str, Any]] | None) -> dict[str, str]:
    """The environment of a run in the tree: none of the outer pytest's variables, this worktree's hf_posenc."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HF_POSENC_SUITE"))}
    env.update(PYTHONPATH=os.pathsep.join(map(str, [ROOT, tree, tree / "deps", PLUGIN_DIR])), HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if cells is not None:
        env["HF_POSENC_SUITE_CELLS"] = json.dumps(cells)
    return env


def capped() -> None:
    """In the child, before exec: the address-space cap (pytest-xdist's workers inherit it)."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def children_cpu() -> float:
    """CPU seconds of every finished child process (and their children) of this process."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclasses.dataclass
class Run:
    """One pytest run in the tree: its junit file, exit status, wall and CPU seconds (its processes', which on a
    shared machine say more than the wall time) and the end of its output."""

    junit: Path
    returncode: int
    seconds: float
    cpu_seconds: float
    tail: str


def pytest_run(tree: Path, test_file: str, cells: list[dict[str, Any]], junit: Path, jobs: int = 2,
               timeout: float = 900.0) -> Run:
    """Run `test_file` in the tree with the plugin's `cells`; a hung run is killed with its workers."""
    junit = junit.resolve()  # the child runs in the tree
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "hf_posenc_suite_plugin",
               "-n", str(jobs), test_file, f"--junitxml={junit}", "-o", "junit_logging=no", "--durations=10"]
    start, used = time.monotonic(), children_cpu()
    child = subprocess.Popen(command, cwd=tree, env=child_env(tree, cells), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, preexec_fn=capped, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        output += f"\n[killed after {timeout:.0f} s]"
    run = Run(junit, child.returncode, time.monotonic() - start, children_cpu() - used, output[-3000:])
    if run.returncode not in (0, 1) or not junit.is_file():  # 0/1: ran, all passed / some failed
        raise RuntimeError(f"pytest in {tree} exited {run.returncode} without a full report:\n{run.tail}")
    return run


def probe(tree: Path, files: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """{family: {"TestClass::ModelClass": schemes}}: supports() on the tests' own tiny configs (probe.py)."""
    args = [f"{family}={path}" for family, path in files.items()]
    done = subprocess.run([sys.executable, str(PROBE), *args], cwd=tree, env=child_env(tree, None), check=True,
                          capture_output=True, text=True, preexec_fn=capped)
    return json.loads(done.stdout.strip().splitlines()[-1])
