"""The docs read right as plain Markdown files, as GitHub and an editor show them, not only as the built site
(issue 61): every link and image resolves from the file itself and each image is one file, the benchmark tables
are in the pages (not an include line) and equal to the files the benchmarks write, the README lists every guide,
its study paragraph ranks the schemes as its table does, and an example that loads a model from the Hub says so."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from test_doc_files import FENCE, LINK
from test_train import REPO

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
INCLUDE = re.compile(r"^<!-- posenc:include (\S+) -->\n(.*?)^<!-- /posenc -->$", flags=re.M | re.S)
# a quoted owner/name in Python code: a Hub repository (out/... is where the pages write their folders)
HUB_ID = re.compile(r"""["'](?!out/)([A-Za-z][\w-]*/[\w.-]+)["']""")
PYTHON = re.compile(r"^```python\n(.*?)^```", flags=re.M | re.S)


def test_every_link_and_image_resolves_from_the_file_itself():
    """No `../assets/...`: that folder exists only in the built site, so GitHub showed a broken image."""
    broken, seen = [], 0
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
            path = target.partition("#")[0]
            if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path):
                continue
            seen += 1
            if not (page.parent / path).is_file():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert seen > 50
    assert not broken, "links that do not resolve from the Markdown file:\n" + "\n".join(broken)


def test_the_benchmark_tables_are_in_the_pages_and_equal_their_files():
    """An include line (`--8<--`) showed as literal text outside the site; a copy in the page must not go stale."""
    copies = [(page, source, text) for page in PAGES
              for source, text in INCLUDE.findall(page.read_text(encoding="utf-8"))]
    assert len(copies) >= 7
    for page, source, text in copies:
        assert text == (REPO / source).read_text(encoding="utf-8").rstrip("\n") + "\n", (
            f"{page.relative_to(REPO)}'s copy of {source} is stale: run `python docs/hooks.py`")
    assert not [page for page in PAGES if re.search(r"^--8<--", page.read_text(encoding="utf-8"), flags=re.M)]
    assert "snippets" not in (REPO / "mkdocs.yml").read_text(encoding="utf-8")  # nothing includes any more


def test_the_readme_links_every_guide_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    missing = [page.name for page in sorted((DOCS / "guide").glob("*.md"))
               if page.relative_to(REPO).as_posix() not in linked]
    assert not missing, f"README.md's guide list lacks {missing}"


def test_an_example_that_loads_from_the_hub_says_so():
    """The pages' Python examples load the packaged models (offline), or the paragraph before one says that it
    downloads from the Hub: `HuggingFaceTB/SmolLM2-135M` failed on a fresh offline machine without a word."""
    unsaid = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in PYTHON.finditer(text):
            before = [p for p in text[:block.start()].split("\n\n") if p.strip()][-1]
            ids = HUB_ID.findall(block.group(1))
            if ids and not (re.search(r"\bHub\b", before) and re.search(r"network|download|offline", before)):
                unsaid.append(f"{page.relative_to(REPO)}: {ids[0]}")
    assert not unsaid, "examples that need the Hub without saying so:\n" + "\n".join(unsaid)


def test_the_hub_rule_sees_a_hub_id_and_not_a_folder():
    assert HUB_ID.findall('load("HuggingFaceTB/SmolLM2-135M"); save("out/smollm2-alibi"); hp.load("smollm2")') == [
        "HuggingFaceTB/SmolLM2-135M"]


def test_each_image_is_one_file():
    """The pages link a plot where its script writes it (docs/hooks.py serves it to the site), never a copy in docs/:
    docs/minilm_*.png were copies of benchmarks/results/inspect_minilm/*.png."""
    images = [path for folder in ("docs", "benchmarks") for suffix in ("png", "svg", "jpg")
              for path in (REPO / folder).rglob(f"*.{suffix}")]
    by_bytes: dict[str, list[str]] = {}
    for path in images:
        by_bytes.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), []).append(path.relative_to(REPO).as_posix())
    assert len(images) > 10
    assert not [paths for paths in by_bytes.values() if len(paths) > 1]


ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "last": 5}
# the README's phrases for its table's rank columns (-> column numbers after the scheme's cell)
COLUMNS = {"here on both MRR columns": (1, 2), "on the MRR here": (1,), "on repeat and sort": (2,), "in the paper": (3,)}
CLAIM = re.compile(rf"\b({'|'.join(ORDINALS)}) (?:of five )?({'|'.join(COLUMNS)})")


def test_the_readme_study_ranks_equal_its_table():
    """"Their Rotary is second" was second on one column and third on the headline MRR; "ALiBi is where they have
    it" was fourth here and third in the paper. Each scheme's bullet names its rank on every column of the table."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Where models learn"):readme.index("## Documentation")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| their scheme")]
    assert len(rows) == 5
    schemes = ("NoPE", "T5", "ALiBi", "Rotary", "APE")
    ranks = {}
    for column in (1, 2, 3):
        order = sorted(rows, key=lambda row: -float(row[column]))
        for rank, row in enumerate(order, 1):
            name = next(s for s in schemes if s in row[0])
            ranks[name, column] = rank
    bullets = [line for line in re.split(r"\n(?=- )", section) if line.startswith("- ")]
    said = {}
    for bullet in bullets:
        name = next((s for s in schemes if re.match(rf"- {s}\b", bullet)), None)
        if name is None:
            continue
        for ordinal, phrase in CLAIM.findall(" ".join(bullet.split())):
            for column in COLUMNS[phrase]:
                said[name, column] = ORDINALS[ordinal]
    assert set(said) == set(ranks), f"ranks the paragraph does not name: {sorted(set(ranks) - set(said))}"
    assert said == ranks
