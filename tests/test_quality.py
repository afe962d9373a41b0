"""The code base stays ruff- and mypy-clean and free of import cycles: CI enforces what the style guide asks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "src", "tests", "benchmarks", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_is_clean():
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def _fray_import_graph() -> dict[str, set[str]]:
    """Module -> the ``fray`` modules it imports anywhere in its text (top level, functions, TYPE_CHECKING)."""
    src = ROOT / "src"
    paths = {}
    for path in sorted((src / "fray").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        paths[".".join(parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    # ``from pkg import mod`` imports the module; ``from mod import name`` the module itself.
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    if target in paths:
                        graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import cycle (``a -> b -> ... -> a``) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier:  # the shortest way back to start inside the group
            node = frontier.pop(0)
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    cycles.append([*paths[node], start])
                    frontier = []
                    break
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    frontier.append(nxt)
    return sorted(cycles)


def test_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """No cycle among ``src/fray`` modules, counting every import (a lazy one too: it would only hide the cycle)."""
    cycles = _cycles(_fray_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def _production_sources() -> list[Path]:
    return [path for path in (ROOT / "src" / "fray").rglob("*.py") if path.name != "testing.py"]


def test_no_backend_hook_is_found_with_getattr():
    """Every hook is declared on a base (fray/core/_contract.py): none is looked up by name, hoping it is there."""
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _production_sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "getattr(" in line and '"_fray_' in line
    ]
    assert not found, found


def test_no_production_module_imports_the_users_test_helpers():
    """``fray.testing`` is for users' tests; the library does not depend on it."""
    found = []
    for path in _production_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(name == "fray.testing" for name in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_no_folder_of_the_package_holds_over_20_modules():
    """A folder a newcomer can read: past 20 modules a package is split by what its parts are for."""
    crowded = {
        str(folder.relative_to(ROOT)): count
        for folder in [ROOT / "src" / "fray", *(ROOT / "src" / "fray").rglob("*")]
        if folder.is_dir() and folder.name != "__pycache__"
        for count in [len(list(folder.glob("*.py")))]
        if count > 20
    }
    assert not crowded, crowded
