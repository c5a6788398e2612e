"""The Markdown files read right as files, as a new user reads them on GitHub or in an editor: the generated tables
are in them and current, every in-repo link and anchor of README.md and docs/ resolves, and every `hf-posenc eval`
option is in the evaluation guide (`--passkey.trials` / `--passkey.depths` were only in `--help`)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify
from test_train import REPO

from hf_posenc import cli

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_tables_are_written_into_the_pages_and_current():
    hooks = _hooks()
    pages = hooks.pages()
    assert {p.name for p in pages} >= {"schemes.md", "support.md"}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert text.count("<!-- posenc:") == text.count(hooks.END), f"{page}: a table without its end marker"
        assert hooks.fill(text) == text, f"{page.relative_to(REPO)} is stale: run `python docs/hooks.py`"
    assert "| adapters |" in (DOCS / "support.md").read_text()  # the matrix itself, not a placeholder


def anchors(page: Path) -> set[str]:
    """The heading ids of a page, as mkdocs (Python-Markdown's toc) and GitHub make them, and explicit ids."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    ids = set(re.findall(r'id="([\w-]+)"', text)) | set(re.findall(r"\{#([\w-]+)\}", text))
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", text, flags=re.M):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        ids |= {slugify(heading, "-"), re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")}
    return ids


def links() -> list[tuple[Path, str]]:
    return [(page, target) for page in PAGES
            for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not in the repo


def resolve(page: Path, path: str) -> Path:
    """The file a relative link points at; the site serves files outside docs/ under assets/<repo path>."""
    target = (page.parent / path).resolve()
    served = DOCS / "assets"
    return REPO / target.relative_to(served) if target.is_relative_to(served) else target


def test_every_in_repo_link_and_anchor_resolves():
    broken = []
    assert len(links()) > 50
    for page, target in links():
        path, _, anchor = target.partition("#")
        file = resolve(page, path) if path else page
        if not file.exists():
            broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{page.relative_to(REPO)}: {target} (no heading #{anchor} in {file.name})")
    assert not broken, "\n".join(broken)


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Times\n\nsee [times](#times), [gone](#recovery) and [file](missing.md)\n")
    found = LINK.findall(page.read_text())
    assert found == ["#times", "#recovery", "missing.md"]
    assert "times" in anchors(page) and "recovery" not in anchors(page)
    assert not resolve(page, "missing.md").exists()


@pytest.mark.parametrize("flag", [flag for action in cli.build_parser(["eval"])._subparsers._group_actions[0]
                                  .choices["eval"]._actions for flag in action.option_strings
                                  if flag.startswith("--") and flag not in ("--help", "--debug")])
def test_every_eval_option_is_in_the_evaluation_guide(flag):
    guide = (DOCS / "guide" / "eval.md").read_text(encoding="utf-8")
    assert re.search(rf"`{re.escape(flag)}[` =]", guide), f"hf-posenc eval {flag} is not in docs/guide/eval.md"
