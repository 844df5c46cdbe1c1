"""The import graph of the package: no circle, and no arrow from the library into the reproduction.

Read from the sources (every ``import`` statement, at module level or inside a function), so a lazy
import that would close a circle at run time counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parent.parent
#: module name -> its source file: rs_interp's own tree, plus hooks/ installed as rs_interp.hooks.
SOURCES = {
    **{".".join(("rs_interp", *p.relative_to(ROOT / "rs_interp").with_suffix("").parts)).removesuffix(".__init__"): p
       for p in (ROOT / "rs_interp").rglob("*.py")},
    **{".".join(("rs_interp.hooks", *p.relative_to(ROOT / "hooks").with_suffix("").parts)).removesuffix(".__init__"): p
       for p in (ROOT / "hooks").rglob("*.py")},
}


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_package: bool) -> list[str]:
    """The rs_interp modules an import statement names (a name imported from a package may be a submodule)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [target] + [f"{target}.{a.name}" for a in node.names]
    out = []
    for name in names:
        while name and name not in SOURCES:  # `from .x import f`: the module x, not the function f
            name = name.rpartition(".")[0]
        if name.startswith("rs_interp") and name != module:
            out.append(name)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in SOURCES.items():
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        graph[module] = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                         for t in _resolve(module, node, is_package)}
    return graph


def _parents(module: str) -> set[str]:
    """A package's __init__ runs before its submodules: importing a.b.c imports a and a.b too."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & set(SOURCES)


def test_the_graph_sees_the_package():
    graph = _graph()
    assert "rs_interp.registry" in graph["rs_interp"] and "rs_interp.hooks" in graph
    assert "rs_interp.reproduce.context" in graph["rs_interp.reproduce"]


def test_no_import_circle():
    """No module reaches itself through imports (the package __init__ files, which import everything
    they re-export, are left out as sources: they are where a circle would be harmless)."""
    graph = _graph()
    edges = {m: {t for t in ts if not SOURCES[t].name == "__init__.py"} for m, ts in graph.items()
             if SOURCES[m].name != "__init__.py"}
    cycles = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert cycles == []


@pytest.mark.parametrize("module", sorted(m for m in SOURCES if not m.startswith(("rs_interp.reproduce", "rs_interp.cli"))))
def test_the_library_never_imports_the_reproduction(module):
    """One-way: the reproduction (rs_interp.reproduce) reads the library, never the other way, not
    even lazily. The command line (rs_interp.cli) is the application on top of both."""
    assert [t for t in _graph()[module] if t.startswith("rs_interp.reproduce")] == []
