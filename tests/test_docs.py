"""The docs site builds offline with `mkdocs build --strict`, shows what the registry and the benchmarks
say, and keeps every page of its navigation.

The support matrix, the scheme list and the option tables are generated from `hf-posenc list`, and the benchmark
tables the scripts write are copied from their files, by docs/hooks.py (into the pages, and afresh at build time),
so these tests check that the built pages hold them. tests/test_docs_raw.py checks the pages as files. The code
blocks of the pages run in tests/test_readme.py.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# pages every build must have (page source -> what it must hold)
KEY_PAGES = {
    "index.md": "hf-posenc", "guide/patch.md": "Patching a model", "guide/train.md": "recipes",
    "guide/eval.md": "RULER", "guide/serve.md": "vLLM", "guide/inspect.md": "inspect", "guide/hub.md": "Hub",
    "guide/releases.md": "doctor", "schemes.md": "Schemes", "support.md": "Support matrix",
    "benchmarks/study.md": "What we found", "benchmarks/recovery.md": "Recovery", "extending.md": "Extending",
    "layout.md": "laid out", "api.md": "API reference",
}
# benchmark outputs the pages include as they are written, between `<!-- posenc:include FILE -->` markers (page -> files)
INCLUDED = {
    "benchmarks/recovery.md": ["benchmarks/results/recovery/recovery.md", "benchmarks/results/recovery/demo_variants.md"],
    "benchmarks/study.md": ["benchmarks/study/results.md"],
    "support.md": ["benchmarks/results/seq2seq_support.md"],
    "guide/serve.md": ["benchmarks/results/serving.md"],
    "benchmarks/layers.md": ["benchmarks/results/layers.md"],
}


def page_html(site: Path, source: str) -> str:
    target = site / ("index.html" if source == "index.md" else source.removesuffix(".md") + "/index.html")
    return target.read_text(encoding="utf-8")


def text_of(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # no network: a build that reaches for one (fonts, plugins) fails instead of hanging
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_MKDOCS_2_WARNING": "1", "no_proxy": "*",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    print(f"mkdocs build --strict: {time.perf_counter() - start:.1f} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_the_site_builds_with_every_key_page(site):
    for source, wanted in KEY_PAGES.items():
        assert (DOCS / source).is_file(), source
        assert wanted in text_of(page_html(site, source)), f"{source} lost {wanted!r}"
    assert "fonts.googleapis" not in page_html(site, "index.md"), "the theme fetches fonts: set theme.font: false"


def test_every_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert page.relative_to(DOCS).as_posix() in nav, f"{page} is not in mkdocs.yml's nav"


def tables(markup: str) -> list[list[list[str]]]:
    """Each <table> of a page as rows of cell texts, the header row first."""
    return [[[text_of(c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, flags=re.S)]
             for row in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)]
            for table in re.findall(r"<table>(.*?)</table>", markup, flags=re.S)]


def test_the_support_matrix_is_the_registry(site):
    """Every (adapter, scheme) cell of the built page, in both tables, is what the registry says (through
    `hf-posenc list --json`, whose data tests/test_cli.py keeps equal to the registry)."""
    listing = json.loads(subprocess.run([sys.executable, "-m", "hf_posenc.cli", "list", "--json"], cwd=REPO,
                                        capture_output=True, text=True, check=True).stdout)
    matrix = listing["matrix"]
    grouped, full = tables(page_html(site, "support.md"))[:2]
    schemes = full[0][1:]
    assert sorted(schemes) == sorted(next(iter(matrix.values())))
    assert {row[0]: {s: mark == "yes" for s, mark in zip(schemes, row[1:])} for row in full[1:]} == matrix
    seen = {}
    for row in grouped[1:]:
        for adapter in row[0].split(", "):
            for group, mark in zip(grouped[0][1:], row[1:]):
                for scheme in group.split(", "):
                    seen.setdefault(adapter, {})[scheme] = mark == "yes"
    assert seen == matrix
    # what the page says under the table
    assert not any(matrix[a][s] for a in ("bert", "roberta", "distilbert") for s in ("xpos", "self_extend"))
    schemes_page = tables(page_html(site, "schemes.md"))[0]
    assert sorted(row[0] for row in schemes_page[1:]) == sorted(schemes)


def test_the_benchmark_tables_are_the_files_the_benchmarks_write(site):
    for source, files in INCLUDED.items():
        assert all(f"<!-- posenc:include {f} -->" in (DOCS / source).read_text() for f in files), source
        built = text_of(page_html(site, source))
        for f in files:
            rows = [line for line in (REPO / f).read_text().splitlines() if line.startswith("|")]
            first_row = rows[2].split("|")[1].strip()  # after the header and its rule
            assert first_row in built, f"{source} does not show {f}"


def test_the_plots_are_in_the_site(site):
    """Every image a built page shows is a file of the site (the plots live in benchmarks/, served by docs/hooks.py)."""
    shown = 0
    for page in site.rglob("*.html"):
        for src in re.findall(r'<img[^>]* src="([^"]+)"', page.read_text(encoding="utf-8")):
            if not src.startswith(("http:", "https:", "data:")):
                assert (page.parent / src).resolve().is_file(), f"{page}: {src}"
                shown += 1
    assert shown >= 9


def test_the_readme_shows_the_demo_table_of_the_demo_page():
    """The headline table on the README's first screen is the demo page's (one table, two places)."""
    def table(text: str) -> str:
        return re.search(r"^\| model \| ppl @ 128 .*?(?=\n\n)", text, flags=re.S | re.M).group(0)

    assert table((REPO / "README.md").read_text()) == table((DOCS / "benchmarks" / "demo.md").read_text())


# ---------------------------------------------------------------- every time figure states its conditions (issue 38)

# a duration: "7 min 42 s", "0.49 s", "86 minutes", "1,007 CPU-s", "~8 CPU-minutes", "20-minute"
TIME_FIGURE = re.compile(r"(?<![\w.])\d[\d,.]*(?:[–-]\d[\d,.]*)?(?:\s|-)?(?:ms|s|sec|seconds?|min|minutes?|h|hours?|"
                         r"CPU-s|CPU-seconds?|CPU-minutes?)(?![\w-])")
# a limit, not a measurement: a budget, a timeout, "within 1 s", "every 15 s", "10 minutes a command"
LIMIT_BEFORE = re.compile(r"(every|waits?|within|budget|default|at most|up to|limit|timeout|deadline|after|under|<|≤|"
                          r"no more than|longer than|over|past)\W*(\w+\W+){0,2}$", re.I)
LIMIT_AFTER = re.compile(r"^\W*(budget|limit|timeout|of device time|a command)", re.I)
# the conditions: which machine, and how busy it was ("load not recorded" where nobody wrote it down)
MACHINE = re.compile(r"\bcores?\b|\bCPUs?\b|\bGPUs?\b|H100|H200|machine", re.I)
LOAD = re.compile(r"\bidle\b|\bbusy\b|\bshared\b|load average|\bloaded\b|load (was |were )?not recorded|\(load|\bload \d|other jobs|"
                  r"other work|nothing else|contention|at a time|\bquiet\b", re.I)
TIMED_PAGES = ["README.md", "docs/**/*.md", "benchmarks/**/*.md", "recipes/**/README.md", "model_cards/*.md",
               "hf_posenc/model_cards/*.md"]


def _blocks(text: str) -> list[str]:
    """Paragraphs and list items, outside code blocks; a table is read with the paragraph before it (its caption)."""
    blocks, current, code, caption = [], [], False, ""
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            code = not code
            continue
        if code:
            continue
        if not line.strip() or line.startswith("#") or line.lstrip().startswith("- "):
            if current:
                table = current[0].startswith("|")
                blocks.append(("\n".join([caption] if table else []) + "\n" + "\n".join(current)).strip())
                caption = "" if table else " ".join(current)
            current = [] if not line.strip() or line.startswith("#") else [line]
            if line.startswith("#"):
                caption = ""
            continue
        current.append(line)
    return blocks


def _measured(block: str) -> list[str]:
    """The time figures in a block that are measurements, not limits (a table column headed 'budget' is limits)."""
    found = []
    rows = block.splitlines()
    header = next((row for row in rows if row.startswith("|")), "")
    for row in rows if header else [block]:
        cells = row.split("|") if row.startswith("|") else [row]
        for i, cell in enumerate(cells):
            heading = header.split("|")[i] if row.startswith("|") and i < len(header.split("|")) else ""
            if re.search(r"budget|limit|timeout", heading, re.I):
                continue
            joined = " ".join(cell.split())
            found += [m.group(0) for m in TIME_FIGURE.finditer(joined)
                      if not LIMIT_BEFORE.search(joined[:m.start()][-40:]) and not LIMIT_AFTER.search(joined[m.end():])]
    return found


def test_every_time_figure_states_its_machine_and_load():
    """A wall or CPU time in the README, the docs, the benchmark write-ups, recipes' READMEs and model cards says,
    in its paragraph (or a table's caption), on what machine and how busy it was: the demo's 7 min 42 s on idle
    cores was 74 min on busy ones."""
    missing = []
    for pattern in TIMED_PAGES:
        for page in sorted(REPO.glob(pattern)):
            for block in _blocks(page.read_text(encoding="utf-8")):
                if (figures := _measured(block)) and not (MACHINE.search(block) and LOAD.search(block)):
                    missing.append(f"{page.relative_to(REPO)}: {figures[:3]} in {block[:120]!r}")
    assert not missing, "times without their conditions:\n" + "\n".join(missing)


def test_the_time_rule_sees_times_and_limits():
    """The rule's own cases: a bare time is caught, a stated one passes, limits are not times."""
    assert _measured("the run took 77 minutes") == ["77 minutes"]
    assert _measured("7 min 42 s wall") == ["7 min", "42 s"]
    assert _measured("refused within 1 s; a line every 15 s; 15 minutes of device time") == []
    assert _measured("| stage | budget (of 540 s) |\n|---|---|\n| 1 | 120 s |") == []
    assert _blocks("Caption on 2 idle cores:\n\n| a | b |\n|---|---|\n| x | 3 s |")[-1].startswith("Caption")
