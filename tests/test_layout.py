"""The spine of the package stays drawable (docs/layout.md): the import-linter layers contract in pyproject.toml
holds, no import cycle (function-local imports counted: a local import that dodges a cycle is a cycle), no module
over 400 lines, no function over 80, and no module imports another's private name."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_posenc"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

# Edges left out of the cycle check, for good: folders written before the reader moved to `loading` run remote
# code that imports `from_pretrained` and `load_config` from `saving` (saving.__getattr__); pyproject's contract
# ignores the same edge.
LEGACY_EDGES = {("hf_posenc.saving", "hf_posenc.loading")}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def parse(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


def type_checking_only(tree: ast.Module) -> set[int]:
    """Nodes under `if TYPE_CHECKING:`: never run, so no edge (import-linter's exclude_type_checking_imports)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            skipped |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return skipped


def imports(name: str) -> list[tuple[str, str]]:
    """(module imported, name imported from it or "") for every import of an hf_posenc module in `name`,
    function-local ones included."""
    tree = parse(name)
    skipped = type_checking_only(tree)
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.startswith("hf_posenc")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.startswith("hf_posenc"):
                found += [(source, alias.name) for alias in node.names]
    return found


def owner(target: str) -> str | None:
    """The module of the package a dotted import target lives in (a module, or a name inside one)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for source, imported in imports(name):
            target = owner(f"{source}.{imported}" if imported else source)
            if target and target != name and (name, target) not in LEGACY_EDGES:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_import_contract_holds():
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                               "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_import_cycle_counting_function_local_imports():
    assert cycles(graph()) == []


def test_no_module_over_400_lines():
    long = {name for name, path in MODULES.items()
            if len(path.read_text(encoding="utf-8").splitlines()) > MAX_MODULE_LINES}
    assert long == set()


def test_no_function_over_80_lines():
    long = set()
    for name in MODULES:
        for node in ast.walk(parse(name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long.add(f"{name}.{node.name}")
    assert long == set()


def test_no_module_imports_a_private_name_of_another():
    private = [f"{name}: {imported} from {source}" for name in MODULES for source, imported in imports(name)
               if imported.startswith("_") and not imported.startswith("__")]
    assert private == []


def branches_on(value: str, names: set[str], allowed: str) -> list[str]:
    """Where a module outside the `allowed` folder compares something called `value` (an attribute or a variable of
    that name: `spec.site`, `site`) with a literal in `names`, or looks a table up by it: branching on what the
    modules in `allowed` should answer themselves."""
    def called(node: ast.AST) -> bool:
        return getattr(node, "attr", getattr(node, "id", None)) == value

    def literals(node: ast.AST) -> set[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)} & names

    found = []
    for name, path in MODULES.items():
        if name.startswith(f"hf_posenc.{allowed}"):
            continue
        for node in ast.walk(parse(name)):
            sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            if any(map(called, sides)) and any(literals(side) for side in sides):
                hits = sorted(set().union(*map(literals, sides)))
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} compares {value} with {hits}")
            lookup = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" and node.args
            if isinstance(node, ast.Subscript) and called(node.slice) or lookup and called(node.args[0]):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} looks a table up by {value}")
    return found


def test_no_function_outside_sites_branches_on_a_site_name():
    from hf_posenc.sites import SITES

    assert branches_on("site", set(SITES), "sites") == []


def test_sites_import_nothing_that_writes_folders():
    """Recording (config.posenc, the save hook) is `hf_posenc.recording`'s; the installers only install."""
    assert [f"{name} imports {source}" for name in MODULES if name.startswith("hf_posenc.sites")
            for source, _ in imports(name) if source.startswith("hf_posenc.saving")] == []
