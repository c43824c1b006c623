"""The import graph of the installed packages: imports point down the layers, and no cycles.

Layers, low to high: ``kernel`` < ``autotune`` < ``server``; inside ``server``:
``store`` and ``settings`` < {``api``, ``dashboard``, ``worker``} < {``bench``, ``app``} < ``cli``
(the command line is the entry point: it runs the benchmarks), with no imports between
the packages of one layer. Every import counts, at module level or inside a function (a
lazy import is still a dependency). ``migrations`` stands apart: Alembic's environment
may use the store and the settings, and only the store's migration runner uses it.
Product code never reads ``tests/``.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGES = ("kernel", "autotune", "server", "migrations")
TOP = {"kernel": 0, "autotune": 1, "server": 2}
SERVER = {"store": 0, "settings": 0, "api": 1, "dashboard": 1, "worker": 1, "bench": 2, "app": 2, "cli": 3}


def _modules() -> dict[str, Path]:
    """Every module of the installed packages, found the way the interpreter finds them."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
        for root in spec.submodule_search_locations:
            for path in Path(root).rglob("*.py"):
                parts = [package, *path.relative_to(root).with_suffix("").parts]
                if parts[-1] == "__init__":
                    parts.pop()
                out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    """The project modules ``module`` imports (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def layer(module: str) -> tuple[int, int] | None:
    """(top-level layer, layer inside server) of a module; None for migrations."""
    parts = module.split(".")
    if parts[0] not in TOP:
        return None
    inner = SERVER.get(parts[1], -1) if parts[0] == "server" and len(parts) > 1 else -1
    return TOP[parts[0]], inner


def unit(module: str) -> str:
    """The package a rule is about: ``server.api``, ``kernel``, ..."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "server" and len(parts) > 1 else parts[0]


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that do not point down the layers (``a -> b``), per the module docstring."""
    bad = []
    for module, targets in graph.items():
        for target in targets:
            if unit(module) == unit(target):
                continue
            mine, theirs = layer(module), layer(target)
            if mine is None or theirs is None:
                allowed = (module.startswith("migrations") and unit(target) in ("server.store", "server.settings")) or (
                    target.startswith("migrations") and module == "server.store.migrate"
                )
            elif mine[0] != theirs[0]:
                allowed = theirs[0] < mine[0]
            else:  # inside server: strictly lower, or the package itself (server/__init__)
                allowed = theirs[1] < mine[1]
            if not allowed:
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_packages_are_the_installed_ones() -> None:
    assert {"kernel.attention", "autotune.search", "server.store.db", "server.cli", "migrations.env"} <= set(MODULES)


def test_every_import_points_down_the_layers() -> None:
    assert violations(GRAPH) == []


def test_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_product_code_never_reads_tests() -> None:
    readers = [m for m, p in MODULES.items() if "tests/" in p.read_text() or "'tests'" in p.read_text()]
    assert readers == []
    assert not any(t.split(".")[0] == "tests" for targets in GRAPH.values() for t in targets)


def test_the_client_imports_without_the_service() -> None:
    """Model code installs the client: it must not pull SQLAlchemy, FastAPI, Optuna or uvicorn."""
    heavy = ("sqlalchemy", "fastapi", "optuna", "uvicorn", "starlette", "alembic")
    client = [m for m in MODULES if m.startswith("autotune.client")]
    reached: set[str] = set()
    todo = list(client)
    while todo:
        m = todo.pop()
        if m in reached:
            continue
        reached.add(m)
        todo.extend(GRAPH[m])
    third_party: set[str] = set()
    for m in reached:
        for node in ast.walk(ast.parse(MODULES[m].read_text())):
            if isinstance(node, ast.Import):
                third_party.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                third_party.add(node.module.split(".")[0])
    assert not third_party & set(heavy), sorted(third_party & set(heavy))


@pytest.mark.parametrize(
    ("edge", "why"),
    [
        ("kernel.attention -> autotune.search", "kernel below autotune"),
        ("autotune.search -> server.store.db", "autotune below server"),
        ("server.store.queue -> server.api.deps", "store below api"),
        ("server.api.app -> server.dashboard.routes", "no imports between api and dashboard"),
        ("server.worker.worker -> server.bench.harness", "worker below bench"),
        ("server.bench.service -> server.cli.common", "bench below cli"),
        ("server.bench.service -> server.app", "no imports between bench and app"),
    ],
)
def test_the_checker_catches_an_upward_import(edge: str, why: str) -> None:
    module, target = edge.split(" -> ")
    graph = {m: set(t) for m, t in GRAPH.items()}
    graph[module].add(target)
    assert edge in violations(graph), why


def test_the_checker_catches_a_cycle() -> None:
    graph = {m: set(t) for m, t in GRAPH.items()}
    graph["autotune.space"].add("autotune.search")  # search imports space already
    assert ["autotune.search", "autotune.space"] in cycles(graph) or any(
        {"autotune.search", "autotune.space"} <= set(c) for c in cycles(graph)
    )
