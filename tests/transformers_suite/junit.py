"""Read the junit files of a stock and a patched run and compare them test by test (issue 37).

A finding is a test that passes stock and fails on a patched model, unless its first error line is a documented
departure (expected_failures.json). A patched test in which no model was patched (the plugin's `posenc_patched`
property is absent) is counted apart: it is not a pass on a patched model.
"""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

LABEL = re.compile(r"\[posenc=(?P<label>[^\]]+)\]$")
WORSE = {"skipped": 0, "passed": 1, "failed": 2}  # a test reported twice (subtests) keeps its worst outcome
EXPECTED = Path(__file__).with_name("expected_failures.json")


@dataclasses.dataclass
class Case:
    """One test of one run: `test` is `Class::method`, `cell` the plugin's label (None in the stock run)."""

    test: str
    cell: str | None
    outcome: str
    message: str = ""
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    where: str = ""  # the source line the error came from ("2 != 3" says little without it)


def first_line(element: ET.Element) -> str:
    """The first line of a failure: its message, else its text."""
    text = (element.get("message") or element.text or "").strip()
    return text.splitlines()[0][:300] if text else element.get("type", "")


FRAME = re.compile(r"^(?P<path>[^\s:]+\.py):(?P<line>\d+): ")


def frames_of(text: str) -> list[tuple[str, str]]:
    """(path:line, source line) of each traceback entry: long entries mark the line with `>` above their
    location, short ones (pytest's middle entries) print it indented below."""
    frames: list[tuple[str, str]] = []
    lines = text.splitlines()
    marked = ""
    for index, line in enumerate(lines):
        if line.startswith(">"):
            marked = line[1:].strip()
        elif found := FRAME.match(line):
            path = re.sub(r"^(\.\./)+|^.*site-packages/", "", found["path"])
            below = lines[index + 1].strip() if index + 1 < len(lines) and not marked else ""
            frames.append((f"{path}:{found['line']}", (marked or below)[:160]))
            marked = ""
    return frames


def failing_line(element: ET.Element) -> str:
    """Where a failure happened: the source line of the last frame in the test tree (`tests/...`, what the
    test checked) and the file and line the error was raised at."""
    frames = frames_of(element.text or "")
    if not frames:
        return ""
    tested = [f for f in frames if f[0].startswith("tests/") and not f[0].startswith("tests/transformers_suite/")]
    where = f"{tested[-1][1]} ({tested[-1][0]})" if tested else ""
    return where if tested and frames[-1] == tested[-1] else f"{where}; raised at {frames[-1][0]}".lstrip("; ")


def case_of(element: ET.Element) -> Case:
    name = element.get("name", "")
    match = LABEL.search(name)
    test = f"{element.get('classname', '').rpartition('.')[2]}::{LABEL.sub('', name)}"
    properties = {p.get("name", ""): p.get("value", "") for p in element.iter("property")}
    problem = element.find("failure") if element.find("failure") is not None else element.find("error")
    if problem is not None:
        return Case(test, match and match["label"], "failed", first_line(problem), properties, failing_line(problem))
    outcome = "skipped" if element.find("skipped") is not None else "passed"
    return Case(test, match and match["label"], outcome, "", properties)


def read(path: Path) -> dict[tuple[str, str | None], Case]:
    """{(test, cell): case} of a junit file."""
    cases: dict[tuple[str, str | None], Case] = {}
    for element in ET.parse(path).getroot().iter("testcase"):
        case = case_of(element)
        seen = cases.get((case.test, case.cell))
        if seen is None or WORSE[case.outcome] > WORSE[seen.outcome]:
            cases[(case.test, case.cell)] = case
    return cases


def departures() -> list[dict[str, str]]:
    """The documented departures: failures a patched model is allowed (each names where it is documented)."""
    return json.loads(EXPECTED.read_text(encoding="utf-8"))["departures"]


def departure_of(case: Case, label: str) -> str | None:
    """The departure a patched failure is, if any: its `message` regex found in the failure's first line and, where
    the entry narrows it, `test` found in the test's `TestClass::test_method` and the cell one of its `cells`."""
    for entry in departures():
        if re.search(entry["message"], case.message) and re.search(entry.get("test", ""), case.test) \
                and label in entry.get("cells", [label]):
            return entry["name"]
    return None


def cause(message: str) -> str:
    """A failure's first line with what varies between tests (addresses, temporary paths, numbers) blanked."""
    message = re.sub(r"0x[0-9a-fA-F]+", "0x?", message)
    message = re.sub(r"/tmp/\S+|'/[^']*tmp[^']*'", "<tmp>", message)
    return re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?", "N", message)[:200]


def compare(stock: dict[tuple[str, str | None], Case], patched: dict[tuple[str, str | None], Case],
            label: str) -> dict[str, Any]:
    """One cell: counts, documented departures, and findings (stock pass, patched fail) grouped by cause."""
    counts = {"ran": 0, "passed_patched": 0, "passed_unpatched": 0, "failed_stock_too": 0, "skipped": 0,
              "departures": 0, "findings": 0, "missing_stock": 0}
    causes: dict[str, dict[str, Any]] = {}
    for (test, cell), case in sorted(patched.items()):
        if cell != label:
            continue
        counts["ran"] += 1
        base = stock.get((test, None))
        if case.outcome == "skipped":
            counts["skipped"] += 1
        elif case.outcome == "passed":
            counts["passed_patched" if case.properties.get("posenc_patched") else "passed_unpatched"] += 1
        elif base is None:
            counts["missing_stock"] += 1
        elif base.outcome != "passed":
            counts["failed_stock_too"] += 1
        elif departure_of(case, label):
            counts["departures"] += 1
        else:
            counts["findings"] += 1
            group = causes.setdefault(cause(case.message), {"first_line": case.message, "tests": []})
            group["tests"].append({"test": test, "where": case.where,
                                   **{k: v for k, v in case.properties.items() if k != "posenc_patched"}})
    groups = sorted(causes.values(), key=lambda g: -len(g["tests"]))
    return {"cell": label, **counts, "causes": groups}
