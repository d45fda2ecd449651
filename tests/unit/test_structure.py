"""The package's dependencies point one way (STYLE.md, "Layout"): read from
the source's AST, so an import inside a function or under TYPE_CHECKING
counts as much as one at the top of a module (it is an edge all the same,
taken later or by the type checker)."""

import ast
import itertools
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shardq"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name)."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, source: str, is_package: bool = False) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import statement of module ``name``
    (its ``source``), at any depth; a relative import resolved against the
    module's package, and ``from pkg import name`` as ``pkg.name`` when that
    is a module, else ``pkg``. ``importlib.import_module("literal")`` counts too."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                yield (submodule if submodule in modules() else source), node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno


@cache
def import_graph() -> dict[str, dict[str, int]]:
    """shardq module -> {shardq module it imports: first line}."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules().items():
        edges: dict[str, int] = {}
        for target, line in imported(name, path.read_text(), path.name == "__init__.py"):
            if target in modules() and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan),
    each as one cycle through it, found by a walk from its first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [cycle_through(graph, component) for component in components]


def cycle_through(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One cycle inside ``component``, from its first module back to it (a
    breadth-first walk within the component: the shortest such cycle)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target == start:
                return [*paths[node], start]
            if target in members and target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    return component  # unreachable for a strongly connected component


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{source} (line {graph[source][target]})" for source, target in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def test_the_graph_sees_imports_inside_functions_and_under_type_checking():
    # The reader's own check: an import the graph missed would hide a cycle.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..worker.limits import Limiter\n"
        "def f():\n"
        "    from . import store\n"
        "    from .. import conf\n"
        "    importlib.import_module('shardq.models')\n"
    )
    found = {target for target, _ in imported("shardq.db.example", source)}
    assert found == {"typing", "shardq.worker.limits", "shardq.db.store", "shardq.conf", "shardq.models"}
    # In a package's __init__, "." is the package itself.
    assert {target for target, _ in imported("shardq.db", "from . import store", is_package=True)} == {
        "shardq.db.store"
    }


def test_nothing_in_db_imports_from_worker():
    """The store takes plain values and the worker holds the policy
    (STYLE.md): db/ imports nothing from worker/, not even for types."""
    graph = import_graph()
    found = [
        f"{source} imports {target} (line {line})"
        for source, edges in sorted(graph.items())
        if source == "shardq.db" or source.startswith("shardq.db.")
        for target, line in sorted(edges.items())
        if target == "shardq.worker" or target.startswith("shardq.worker.")
    ]
    assert found == [], "shardq/db must not import shardq/worker (pass plain values instead):\n" + "\n".join(found)


def test_the_package_has_no_import_cycle():
    """No cycle, lazy ones included: a function-level import that closes a
    cycle only moves the failure from import time to call time."""
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package
    found = [describe(graph, cycle) for cycle in cycles(graph)]
    assert found == [], "import cycles (move what both sides need to a third module):\n" + "\n".join(found)
