"""mkdocs hooks: the tables the registry knows and the benchmarks write are generated, never pasted, and written
into the pages.

Each table sits in its page between `<!-- posenc:KIND [ARG] -->` and `<!-- /posenc -->`, so the Markdown files read
right as files too (on GitHub, in an editor); `python docs/hooks.py` rewrites them from their sources,
tests/test_doc_files.py fails when one is stale, and the site build fills them afresh all the same:

- `<!-- posenc:support-matrix -->`: the support matrix, schemes with identical columns grouped, from
  `hf-posenc list --json` (the registry's snapshot, which tests/test_cli.py keeps equal to the registry);
- `<!-- posenc:support-matrix-full -->`: one column per scheme, as `hf-posenc list --wide` prints it;
- `<!-- posenc:schemes -->`: every scheme with its site and source (`hf-posenc list --wide`);
- `<!-- posenc:scheme-options NAME -->`: the options of NAME (`hf-posenc list --scheme NAME`);
- `<!-- posenc:model-types -->`: the causal-LM model types (`hf-posenc list --model-types`);
- `<!-- posenc:eval-options -->`: every `hf-posenc eval` option, its default and help, from its parser;
- `<!-- posenc:include PATH -->`: the file PATH of the repository as it is (a table a benchmark wrote).

Everything comes from running the package's own command line or from the files the benchmarks write, so the
pages say what `hf-posenc list` and the benchmarks say. Images outside docs/ (the plots in benchmarks/) are
linked by their path relative to the page, as GitHub shows them; the site serves them under
`assets/<path in the repository>` and the build rewrites those links to it.
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


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


def eval_options() -> str:
    """Every `hf-posenc eval` option with its default and help, from the parser itself."""
    proc = subprocess.run([sys.executable, "-c", "from hf_posenc import cli; import json; p = cli.build_parser(['eval']); "
                           "e = p._subparsers._group_actions[0].choices['eval']; print(json.dumps([[a.option_strings, "
                           "a.metavar or (a.dest.upper() if a.nargs != 0 else None), repr(a.default) if a.default is not None and "
                           "a.default is not False else '', a.help] for a in e._actions if a.option_strings and a.dest not in "
                           "('help', 'debug')]))"], cwd=REPO, capture_output=True, text=True, check=True)
    lines = ["| option | default | what it does |", "|---|---|---|"]
    for flags, metavar, default, text in json.loads(proc.stdout):
        flag = " / ".join(f"`{f}{f' {metavar}' if metavar else ''}`" for f in flags)
        lines.append(f"| {flag} | {default.replace('|', '/')} | {(text or '').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def include(path: str) -> str:
    """A file of the repository as it is, ending in one newline (the end marker goes on a line of its own)."""
    return (REPO / path).read_text(encoding="utf-8").rstrip("\n") + "\n"


GENERATED = {"support-matrix": grouped_matrix, "support-matrix-full": full_matrix, "schemes": scheme_table,
             "model-types": model_types, "eval-options": eval_options}
# kinds that take an argument: a scheme's name, a file's path in the repository
WITH_ARG = {"scheme-options": scheme_options, "include": include}


END = "<!-- /posenc -->"
# an opening marker, then the table written earlier up to its end marker (none yet: the marker alone)
BLOCK = re.compile(r"^<!-- posenc:([\w-]+)(?: ([\w./-]+))? -->\n(?:(?:(?!^<!-- posenc:).)*?^<!-- /posenc -->$)?",
                   flags=re.M | re.S)
MARKER = re.compile(r"^<!-- (?:posenc:[\w-]+(?: [\w./-]+)?|/posenc) -->$", flags=re.M)
# an image's link target: ![alt](TARGET)
IMAGE = re.compile(r"(!\[[^\]]*\]\()([^()\s#]+)")
PAGES = ("*.md", "*/*.md")


def fill(markdown: str) -> str:
    """The page with every generated table (re)written between its markers."""
    def replace(match: re.Match) -> str:
        kind, arg = match.group(1), match.group(2)
        table = WITH_ARG[kind](arg) if kind in WITH_ARG else GENERATED[kind]()
        return f"<!-- posenc:{kind}{f' {arg}' if arg else ''} -->\n{table}{END}"

    return BLOCK.sub(replace, markdown)


def pages() -> list[Path]:
    return sorted({path for pattern in PAGES for path in DOCS.glob(pattern) if BLOCK.search(path.read_text())})


def outside(page: Path, target: str) -> Path | None:
    """The repository file outside docs/ that an image link of `page` points at (None: a file in docs/, or a URL)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return None
    path = (page.parent / target).resolve()
    return path if path.is_relative_to(REPO) and not path.is_relative_to(DOCS) and path.is_file() else None


def served(path: Path) -> str:
    """Where the site serves a repository file outside docs/ (mkdocs only knows the files under docs_dir)."""
    return f"assets/{path.relative_to(REPO).as_posix()}"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """The page with fresh tables and without their markers (blank lines instead, so each table is a block), its
    images outside docs/ linked where the site serves them."""
    source, folder = Path(page.file.abs_src_path), posixpath.dirname(page.file.src_uri) or "."

    def serve(match: re.Match) -> str:
        path = outside(source, match.group(2))
        return match.group(0) if path is None else match.group(1) + posixpath.relpath(served(path), folder)

    return IMAGE.sub(serve, MARKER.sub("", fill(markdown)))


def on_files(files, config):
    """The site with every image a page links outside docs/, under assets/."""
    shown = {path for page in DOCS.rglob("*.md") for match in IMAGE.finditer(page.read_text(encoding="utf-8"))
             if (path := outside(page, match.group(2))) is not None}
    for path in sorted(shown):
        files.append(File.generated(config, served(path), abs_src_path=str(path)))
    return files


if __name__ == "__main__":
    for path in pages():
        text = path.read_text(encoding="utf-8")
        if fill(text) != text:
            path.write_text(fill(text), encoding="utf-8")
            print(f"wrote the generated tables of {path.relative_to(REPO)}")
