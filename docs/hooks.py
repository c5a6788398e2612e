"""mkdocs hooks: the tables the registry knows are generated when the site is built, never pasted.

- `<!-- posenc:support-matrix -->`: the support matrix, schemes with identical columns grouped, from
  `hf-posenc list --json` (the registry's snapshot, which tests/test_cli.py keeps equal to the registry);
- `<!-- posenc:support-matrix-full -->`: one column per scheme, as `hf-posenc list --wide` prints it;
- `<!-- posenc:schemes -->`: every scheme with its site and source (`hf-posenc list --wide`);
- `<!-- posenc:scheme-options NAME -->`: the options of NAME (`hf-posenc list --scheme NAME`);
- `<!-- posenc:model-types -->`: the causal-LM model types (`hf-posenc list --model-types`).

Everything comes from running the package's own command line, so the pages say what `hf-posenc list`
says. Images and plots outside docs/ (benchmarks/) are served under `assets/<path in the repository>`.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
# plots the pages show, by their path in the repository (served as assets/<path>)
ASSET_GLOBS = ("benchmarks/results/*.png", "benchmarks/results/recovery/*.png", "benchmarks/study/*.png")


@functools.cache
def cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "list", *args], cwd=REPO, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"hf-posenc list {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return proc.stdout


def listing() -> dict:
    return json.loads(cli("--json"))


def grouped_matrix() -> str:
    """Schemes whose column is the same for every adapter share a column; adapters whose row is the
    same share a row (with the model types each covers)."""
    data = listing()
    matrix = data["matrix"]
    adapters = sorted(matrix)
    schemes = sorted(next(iter(matrix.values())))
    columns: dict[tuple, list[str]] = {}
    for scheme in schemes:
        columns.setdefault(tuple(matrix[a][scheme] for a in adapters), []).append(scheme)
    rows: dict[tuple, list[str]] = {}
    for adapter in adapters:
        rows.setdefault(tuple(matrix[adapter][group[0]] for group in columns.values()), []).append(adapter)
    head = "| adapters | " + " | ".join(", ".join(f"`{s}`" for s in group) for group in columns.values()) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    for marks, names in rows.items():
        lines.append(f"| {', '.join(names)} | " + " | ".join("yes" if m else "–" for m in marks) + " |")
    types = ", ".join(f"`{t}`" for t in data["architectures"])
    return "\n".join(lines) + f"\n\nModel types with a hand-written adapter: {types}.\n"


def full_matrix() -> str:
    text = cli("--wide")
    return text[:text.index("\n\n")] + "\n"


def scheme_table() -> str:
    text = cli("--wide")
    schemes = sorted(next(iter(listing()["matrix"].values())))
    lines = ["| scheme | site | source |", "|---|---|---|"]
    for line in text.splitlines():
        match = re.match(r"^(\w+)\s+(\w+)\s+(.*)$", line)
        if match and match.group(1) in schemes:
            lines.append(f"| `{match.group(1)}` | {match.group(2)} | {match.group(3)} |")
    if len(lines) != len(schemes) + 2:
        raise RuntimeError("hf-posenc list did not print one site and source line per scheme")
    return "\n".join(lines) + "\n"


def scheme_options(name: str) -> str:
    text = cli("--scheme", name).strip()
    first, _, table = text.partition("\n")
    return (table + "\n") if table else "No options.\n"


def model_types() -> str:
    text = cli("--model-types")
    return text[:text.index("\n\n")] + "\n"  # the causal-LM table; encoder-decoders have their own section


GENERATED = {"support-matrix": grouped_matrix, "support-matrix-full": full_matrix, "schemes": scheme_table,
             "model-types": model_types}


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind == "scheme-options":
            return scheme_options(arg)
        return GENERATED[kind]()

    return re.sub(r"^<!-- posenc:([\w-]+)(?: (\w+))? -->$", replace, markdown, flags=re.M)


def on_files(files, config):
    for pattern in ASSET_GLOBS:
        for path in sorted(REPO.glob(pattern)):
            rel = path.relative_to(REPO).as_posix()
            files.append(File.generated(config, f"assets/{rel}", abs_src_path=str(path)))
    return files
