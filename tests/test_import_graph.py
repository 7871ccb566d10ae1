"""The import graph of src/dpaudit: no cycle, and every import points down the layer order.

Every ``import`` / ``from ... import`` statement is counted, including those inside functions
(a lazy import hides a cycle until the first refactor). The layers, lowest first, are
:data:`LAYERS` (docs/architecture.md, "Layers"); a module may import its own layer or a lower one
only. dpaudit's own modules are imported at module top, where the graph is visible: never inside a
function, never by name (``importlib.import_module``, ``__import__``), never deferred. Only the heavy
third-party stacks may wait: bound at module top with :func:`dpaudit.lazy.lazy_import` (imported on first
use, so ``dpaudit --help`` runs none of them: tests/cli/test_cli_startup.py) or imported inside a function
(:data:`LAZY_THIRD_PARTY`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dpaudit
from dpaudit.lazy import HEAVY

PACKAGE_ROOT = Path(dpaudit.__file__).resolve().parent

#: Third-party modules a function may import (or :func:`dpaudit.lazy.lazy_import` bind): the heavy stacks, and the optional
#: or platform-specific dependencies that only the functions using them need.
LAZY_THIRD_PARTY = HEAVY + (
    "dp_accounting",
    "PIL",
    "threadpoolctl",
    "psycopg",
    "distributed",
    "statsmodels",
    "fcntl",
)
#: Modules that call ``importlib.import_module`` with a computed name, and why: each imports a third-party module, never dpaudit's.
BY_NAME = {
    "dpaudit.lazy": "the heavy stack a stand-in defers",
    "dpaudit.accounting.opacus_rdp": "Opacus's RDP analysis, when its file cannot be loaded alone",
    "dpaudit.cli.common": "typer's rich help renderer, and the rich classes it imports but dpaudit never uses",
}

#: Lowest first. A module belongs to the layer of its longest matching prefix.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "dpaudit",
            "dpaudit.errors",
            "dpaudit.validation",
            "dpaudit.console",
            "dpaudit.lazy",
            "dpaudit.noise",
            "dpaudit.requests",
            "dpaudit.catalogue",
            "dpaudit.paths",
        ),
    ),
    ("data", ("dpaudit.data",)),
    ("accounting", ("dpaudit.accounting",)),
    ("claims and records", ("dpaudit.claims", "dpaudit.records")),
    ("ledger", ("dpaudit.ledger",)),
    ("audit core", ("dpaudit.audits", "dpaudit.audit_outputs")),
    ("mechanisms", ("dpaudit.mechanisms",)),
    (
        "release and audit orchestration",
        (
            "dpaudit.releasing",
            "dpaudit.release_compat",
            "dpaudit.auditing",
            "dpaudit.one_run_auditing",
            "dpaudit.audit_plans",
        ),
    ),
    ("applications", ("dpaudit.integrations", "dpaudit.sweeps", "dpaudit.reports")),
    ("command line", ("dpaudit.cli",)),
)


def module_name(path: Path, root: Path = PACKAGE_ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(node, package: str, modules) -> list[str]:
    """The dpaudit modules an import statement loads (``from pkg import sub`` loads ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def import_edges(sources: dict[str, tuple[str, bool]]) -> list[tuple[str, str, int, bool]]:
    """(importer, imported, line, inside a function) for every internal import.

    ``sources``: module name -> (source text, is a package ``__init__``)."""
    modules = set(sources)
    edges = []
    for mod, (text, is_package) in sources.items():
        package = mod if is_package else mod.rpartition(".")[0]
        tree = ast.parse(text)
        nested = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)
            if n is not f
        }
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [
                    (mod, t, node.lineno, id(node) in nested)
                    for t in _targets(node, package, modules)
                    if t != mod
                ]
    return edges


def _called(node) -> str:
    fn = node.func
    return fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")


def deferred_imports(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Every import that waits and is not allowed: a third-party module outside :data:`LAZY_THIRD_PARTY` imported in a
    function or bound with ``lazy_import``, any module imported by name outside :data:`BY_NAME` or naming dpaudit, and the
    retired deferral helpers (``lazy_module``, ``lazy_exports``)."""
    bad = []
    for mod, (text, _) in sources.items():
        tree = ast.parse(text)
        for f in ast.walk(tree):
            for node in (
                ast.walk(f) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) else ()
            ):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module]
                else:
                    continue
                bad += [
                    f"{mod}:{node.lineno} imports {n} inside a function"
                    for n in names
                    if n.split(".")[0] not in LAZY_THIRD_PARTY
                    and f"{mod}:{node.lineno} imports {n} inside a function" not in bad
                ]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called, arg = _called(node), node.args[0] if node.args else None
            name = (
                arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
            )
            if called in ("lazy_module", "lazy_exports"):
                bad.append(f"{mod}:{node.lineno} defers a dpaudit module ({called})")
            elif called == "lazy_import" and (
                name is None or name.split(".")[0] not in LAZY_THIRD_PARTY
            ):
                bad.append(
                    f"{mod}:{node.lineno} lazy_import({ast.unparse(arg) if arg else ''}): not a heavy third-party module"
                )
            elif called in ("import_module", "__import__") and (
                name is None
                and mod not in BY_NAME
                or name is not None
                and (name.startswith((".", "dpaudit")))
            ):
                bad.append(
                    f"{mod}:{node.lineno} imports {ast.unparse(arg) if arg else '?'} by name"
                )
    return bad


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b, *_ in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, out, counter = {}, {}, [], set(), [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter
                counter += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(graph[w])))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def layer(module: str) -> int:
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best[0]:
                best = (len(p), i)
    return best[1]


def _package_sources() -> dict[str, tuple[str, bool]]:
    return {
        module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
        for p in sorted(PACKAGE_ROOT.rglob("*.py"))
    }


@pytest.fixture(scope="module")
def edges():
    found = import_edges(_package_sources())
    assert len(found) > 200  # the scan sees the package
    return found


def test_no_import_cycle(edges):
    found = cycles(edges)
    assert not found, "import cycles (imports inside functions counted):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_imports_point_down_the_layers(edges):
    up = [
        f"{a}:{line} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
        for a, b, line, _ in edges
        if layer(b) > layer(a)
    ]
    assert not up, "imports against the layer order:\n" + "\n".join(sorted(up))


def test_no_internal_import_inside_a_function(edges):
    """dpaudit's own modules are imported at module top; only heavy third-party modules (torch, scipy, matplotlib, ...) may
    wait inside a function (481 internal ones before the redesign)."""
    lazy = sorted(
        f"{a}:{line} imports {b} inside a function" for a, b, line, inside in edges if inside
    )
    assert not lazy, "import dpaudit modules at module top level:\n" + "\n".join(lazy)


def test_only_heavy_third_party_modules_wait():
    """No dpaudit module is imported by name or deferred; only :data:`LAZY_THIRD_PARTY` waits."""
    bad = deferred_imports(_package_sources())
    assert not bad, "deferred imports:\n" + "\n".join(bad)


def test_every_module_has_a_layer():
    assert all(layer(m) >= 0 for m in _package_sources())


# The detectors themselves, on small synthetic packages.
def _edges_of(files: dict[str, str]):
    return import_edges(
        {m: (t, m.count(".") == 0 or m.endswith("__init__")) for m, t in files.items()}
    )


def test_detector_sees_a_cycle_hidden_in_a_function():
    files = {"pkg": "", "pkg.a": "from . import b\n", "pkg.b": "def f():\n    from .a import x\n"}
    e = _edges_of(files)
    assert ("pkg.b", "pkg.a", 2, True) in e
    assert cycles(e) == [["pkg.a", "pkg.b"]]


def test_detector_sees_every_deferred_import():
    files = {
        "dpaudit.a": (
            "import importlib\nimport json\nm = importlib.import_module('dpaudit.b')\nx = lazy_module('dpaudit.b')\n"
            "np = lazy_import('numpy')\nrich = lazy_import('rich')\n__getattr__, __dir__ = lazy_exports(__name__, {}, globals())\n"
            "def f(name):\n    import torch\n    import json\n    from scipy import stats\n    from . import b\n"
            "    __import__('dpaudit.b')\n    importlib.import_module(name)\n",
            False,
        )
    }
    bad = deferred_imports(files)
    assert [line.split(" ", 1)[0] for line in bad] == [
        "dpaudit.a:10",
        "dpaudit.a:3",
        "dpaudit.a:4",
        "dpaudit.a:6",
        "dpaudit.a:7",
        "dpaudit.a:13",
        "dpaudit.a:14",
    ], bad
    assert not deferred_imports(
        {"dpaudit.lazy": ("import importlib\ndef f(n):\n    importlib.import_module(n)\n", False)}
    )


def test_detector_no_false_cycle_through_a_package_init():
    # `from . import b` inside pkg.a is an edge to pkg.b, not to pkg (whose __init__ imports a).
    files = {"pkg": "from . import a\n", "pkg.a": "from . import b\n", "pkg.b": ""}
    assert cycles(_edges_of(files)) == []


def test_layer_of_longest_prefix():
    assert LAYERS[layer("dpaudit.cli.audit")][0] == "command line"
    assert LAYERS[layer("dpaudit.audits.stats")][0] == "audit core"
    assert LAYERS[layer("dpaudit")][0] == "base"
    assert (
        layer("dpaudit.mechanisms.dpsgd.module_training")
        > layer("dpaudit.audits.engine")
        > layer("dpaudit.ledger.book")
    )
