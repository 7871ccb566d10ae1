"""The shape of src/dpaudit, as the redesign fixed it: small functions, few parameters.

Cyclomatic complexity is radon's (``radon cc``): no function above 25, at most 5 % above 10
(the anchors dp_accounting, jax_privacy and Opacus: 2.2-3.4 %). At most 10 functions take 10 or
more parameters (``self`` / ``cls`` not counted); options travel in small frozen dataclasses.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dpaudit

radon_complexity = pytest.importorskip(
    "radon.complexity", reason="radon (a test extra) is not installed"
)

PACKAGE_ROOT = Path(dpaudit.__file__).resolve().parent
MAX_COMPLEXITY = 25
SHARE_ABOVE_10 = 0.05
MAX_WIDE_FUNCTIONS = 10


def _sources():
    return [(p, p.read_text(encoding="utf-8")) for p in sorted(PACKAGE_ROOT.rglob("*.py"))]


def complexities(text: str) -> list[tuple[str, int]]:
    """(name, cyclomatic complexity) of every function and method in ``text`` (closures too)."""
    out = []

    def walk(blocks):
        for b in blocks:
            if hasattr(
                b, "closures"
            ):  # a function or method (cc_visit lists methods beside their class)
                out.append((b.fullname, b.complexity))
                walk(b.closures)

    walk(radon_complexity.cc_visit(text))
    return out


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return n - 1 if names and names[0] in ("self", "cls") else n


@pytest.fixture(scope="module")
def functions():
    found = []
    for path, text in _sources():
        rel = path.relative_to(PACKAGE_ROOT.parent)
        found += [(f"{rel}:{name}", cc) for name, cc in complexities(text)]
    assert len(found) > 500
    return found


def test_no_function_above_the_complexity_cap(functions):
    over = sorted((cc, name) for name, cc in functions if cc > MAX_COMPLEXITY)
    assert not over, f"functions with cyclomatic complexity > {MAX_COMPLEXITY}:\n" + "\n".join(
        f"{cc} {n}" for cc, n in over
    )


def test_few_functions_above_10(functions):
    above = sorted(((cc, name) for name, cc in functions if cc > 10), reverse=True)
    share = len(above) / len(functions)
    assert share <= SHARE_ABOVE_10, (
        f"{len(above)} of {len(functions)} functions ({share:.1%}) have complexity > 10 "
        f"(at most {SHARE_ABOVE_10:.0%}):\n" + "\n".join(f"{cc} {n}" for cc, n in above[:40])
    )


def test_few_functions_with_10_or_more_parameters():
    wide = []
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and parameter_count(node) >= 10
            ):
                wide.append(
                    f"{path.relative_to(PACKAGE_ROOT.parent)}:{node.lineno} {node.name} ({parameter_count(node)})"
                )
    assert len(wide) <= MAX_WIDE_FUNCTIONS, (
        f"{len(wide)} functions take >= 10 parameters (at most {MAX_WIDE_FUNCTIONS}):\n"
        + "\n".join(wide)
    )


def test_measures_on_known_code():
    text = "def f(a, b, c):\n    if a:\n        return 1\n    for x in b:\n        if x and c:\n            return 2\n    return 3\n"
    assert complexities(text) == [("f", 5)]
    tree = ast.parse("class A:\n    def m(self, a, b, *c, d, **e): pass\n")
    assert parameter_count(next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))) == 5
