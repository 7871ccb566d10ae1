"""Imports inside dpaudit.reports run one way: loaders -> recomputation -> sections -> model -> renderers.

The graph is read from the source with ``ast`` (every import, including the ones inside
functions: a lazy import that closes a circle is still a circle), so the test needs no
import-time tricks and names the modules of any cycle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dpaudit.reports

PACKAGE = "dpaudit.reports"
#: The layer of every module; an import may only go to the same or a lower layer. Equal layers
#: may import each other as long as the whole graph stays acyclic (a section may use another's
#: helper, e.g. the verdict uses the audit entries).
LAYERS = {
    "audit_view": 0,
    "inputs": 0,
    "stats": 0,  # loaders (typed readers) and pure numerics: inputs imports only audit_view
    "recompute": 1,  # epsilons recomputed from stored events (dpaudit.claims' cache)
    "claim": 2,
    "provenance": 2,
    "budget": 2,
    "utility": 2,
    "audit": 2,
    "verdict": 2,
    "reproduce": 2,
    "sweep": 2,
    "model": 3,  # assembles the sections into the JSON model
    "format": 4,
    "audit_blocks": 4,
    "sweep_blocks": 4,
    "blocks": 4,
    "plots": 4,
    "html": 4,
    "markdown": 4,
    "tradeoff": 4,  # renderers
    "write": 5,
    "__init__": 5,  # writing a report; the package's facade (lazy exports)
    "verify": 2,  # `dpaudit bundle` / `dpaudit verify`: the evidence re-checked (no report module imported)
}


def _modules() -> dict[str, Path]:
    root = Path(dpaudit.reports.__file__).parent
    return {f.stem: f for f in sorted(root.glob("*.py"))}


def _targets(node: ast.AST, modules: set[str]) -> set[str]:
    """The package modules one import statement reaches."""
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name.startswith(PACKAGE + "."):
                out.add(a.name[len(PACKAGE) + 1 :].split(".")[0])
    elif isinstance(node, ast.ImportFrom):
        if node.level == 1:  # from .x import y / from . import x
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names if a.name in modules)
        elif (
            node.level == 0
            and node.module
            and (node.module == PACKAGE or node.module.startswith(PACKAGE + "."))
        ):
            rest = node.module[len(PACKAGE) :].lstrip(".")
            if rest:
                out.add(rest.split(".")[0])
            else:
                out.update(a.name for a in node.names if a.name in modules)
    return out & modules


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    names = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = set()
        for node in ast.walk(tree):
            graph[name] |= _targets(node, names)
        graph[name].discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], else None (depth-first search with colours)."""
    colour = {n: 0 for n in graph}  # 0 unseen, 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        colour[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if colour[m] == 1:
                return stack[stack.index(m) :] + [m]
            if colour[m] == 0:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        colour[n] = 2
        return None

    for n in sorted(graph):
        if colour[n] == 0:
            found = visit(n)
            if found:
                return found
    return None


def test_graph_reader_sees_relative_absolute_and_lazy_imports():
    src = "from .a import x\nfrom . import b, notamodule\nimport dpaudit.reports.c\ndef f():\n    from dpaudit.reports.d import y\nfrom .. import e\n"
    seen: set[str] = set()
    for node in ast.walk(ast.parse(src)):
        seen |= _targets(node, {"a", "b", "c", "d", "e"})
    assert seen == {"a", "b", "c", "d"}  # `from .. import e` is outside the package


def test_find_cycle_finds_a_planted_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_reports_import_graph_is_acyclic():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle inside dpaudit.reports: " + " -> ".join(cycle)


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_layers():
    graph = import_graph()
    assert set(graph) <= set(LAYERS), (
        f"modules without a layer in this test: {sorted(set(graph) - set(LAYERS))}"
    )
    upward = sorted(
        f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]})"
        for a, deps in graph.items()
        for b in deps
        if LAYERS[b] > LAYERS[a]
    )
    assert not upward, "; ".join(upward)


def test_loaders_import_nothing_of_the_package():
    graph = import_graph()
    assert graph["inputs"] <= {"audit_view"} and graph["audit_view"] == set()
    assert graph["stats"] == set()
