"""The import graph of the package: no circle, the packages' direction (the user-facing layer above the
analyses above the core), and no arrow from the library into the reproduction.

Read from the sources (every ``import`` statement, at module level or inside a function), so a lazy
import that would close a circle at run time counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
        # `from pkg import mod` imports the module mod; `from mod import f` the module mod
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in SOURCES else target for a in node.names]
    out = []
    for name in names:
        while name and name not in SOURCES:  # `from .x import f`: the module x, not the function f
            name = name.rpartition(".")[0]
        if name.startswith("rs_interp") and name != module:
            out.append(name)
    return out


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    """module -> the rs_interp modules it imports (parsed once per session)."""
    graph = {}
    for module, path in SOURCES.items():
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"
        graph[module] = frozenset(t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                         for t in _resolve(module, node, is_package))
    return graph


def _parents(module: str) -> set[str]:
    """A package's __init__ runs before its submodules: importing a.b.c imports a and a.b too."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & set(SOURCES)


def test_the_graph_sees_the_package():
    graph = _graph()
    assert "rs_interp.models.registry" in graph["rs_interp"] and "rs_interp.hooks" in graph
    assert "rs_interp.reproduce.context" in graph["rs_interp.reproduce"]


def test_no_import_circle():
    """No module reaches itself through the imports it writes, package ``__init__`` files included (an
    import of ``rs_interp._backend`` is an edge to the package's ``__init__``). The implicit import of a
    parent package (importing ``a.b`` runs ``a/__init__`` first) is not an edge: Python runs it once,
    and a module reads only what it names."""
    edges = _graph()
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


#: The packages' roles, bottom to top: the core (the exact core, the backend, the hook factories and the
#: top-level modules, the common substrate), the analyses, the user-facing layer. The reproduction is apart,
#: with the study code only it reads (the theory lab, the case study): it reads everything; only the command
#: line reads it.
ANALYSES = ("readouts", "heads", "circuits", "features", "models", "tasks", "scale", "variables")
APART = ("reproduce",)
#: role -> the roles it may import.
MAY_IMPORT = {
    "core": {"core"},
    "analysis": {"analysis", "core"},
    "ui": {"ui", "analysis", "core", "facade"},
}


def _role(module: str) -> str:
    """The role of a module: ``facade`` (``rs_interp`` itself, which names every public name lazily),
    ``analysis``, ``ui``, ``apart`` or ``core`` (every other package and top-level module)."""
    if module == "rs_interp":
        return "facade"
    package = module.split(".")[1]
    return ("analysis" if package in ANALYSES else "apart" if package in APART
            else package if package == "ui" else "core")


def test_every_package_has_a_role():
    """A new package is placed on purpose: each package of ``rs_interp`` is one this file names (or a
    core package)."""
    packages = {p.name for p in (ROOT / "rs_interp").iterdir() if (p / "__init__.py").is_file()}
    assert packages - {*ANALYSES, *APART, "ui"} == {"exact", "_backend"}


def test_the_packages_direction():
    """The user-facing layer (``ui``: figures, the command line) reads the analyses and the core; the
    analyses read the core, never ``ui``; the core reads no analysis and no ``ui``. Only the command
    line (``rs_interp.ui.cli``) reads the reproduction."""
    graph = _graph()
    assert ("rs_interp.readouts.lens" in graph["rs_interp.reproduce.gpt2_check"]
            and "rs_interp.exact.certificate" in graph["rs_interp.heads.roles"])  # the graph sees the packages
    offenders = []
    for module, targets in graph.items():
        role = _role(module)
        if role in ("facade", "apart"):
            continue
        for target in targets:
            if _role(target) not in MAY_IMPORT[role] and not (module == "rs_interp.ui.cli" and target.startswith("rs_interp.reproduce")):
                offenders.append((module, target))
    assert offenders == []


#: What the tasks read besides the core and themselves: the models' data (induction's sequences). Not a method:
#: MIB's graph files, which describe circuits, live beside them (rs_interp.circuits.mib_files).
TASKS_READ = ("rs_interp.tasks", "rs_interp.models")
#: No arrow from the tasks up to the methods: a task's position schema (``PositionSchema``) lives in
#: ``rs_interp.tasks.schema``, and ``circuits.positions`` reads it from there.
TASKS_UP: set = set()


def test_the_tasks_sit_below_the_methods():
    """A task (clean and corrupted prompts, answers, a metric) is the data the methods read: ``rs_interp.tasks``
    reads the core and the models' data, never ``circuits``, ``scale`` or another analysis (issue 65: MIB's file
    code, which made ``tasks`` import ``circuits.graph``, moved beside the circuits)."""
    graph = _graph()
    assert "rs_interp.models.data" in graph["rs_interp.tasks.induction"]  # the graph sees the tasks' imports
    up = {(m, t) for m, targets in graph.items() if m.startswith("rs_interp.tasks") for t in targets
          if _role(t) != "core" and not t.startswith(TASKS_READ)}
    assert up == TASKS_UP


def test_no_version_outside_the_backend():
    """Every difference between TransformerLens versions lives in ``rs_interp._backend``: no other
    module reads ``TL_MAJOR`` or imports a version's module (the report names the version it ran on)."""
    offenders = []
    for module, path in SOURCES.items():
        if module.startswith("rs_interp._backend"):
            continue
        text = path.read_text()
        if "TL_MAJOR" in text or "_backend.tl3" in text or "_backend.tl4" in text or "from ._backend.tl" in text:
            offenders.append(module)
    assert offenders == []


def test_the_backend_imports_nothing_above_it():
    """The lowest package (``rs_interp._backend``) reads only itself and the top-level modules of the substrate
    (``_names``, ``_messages``, ``_norm`` ...), and what those read, followed through, is the same: no import
    climbs to another package (the exact core, an analysis, ``rs_interp`` itself). Each version's own
    functions are held to the backend's declared contract by tests/_backend/test_contract.py."""
    graph = _graph()
    assert "rs_interp._names" in graph["rs_interp._backend"]  # the graph sees the backend's imports
    reached, todo = set(), [m for m in graph if m.startswith("rs_interp._backend")]
    while todo:
        module = todo.pop()
        for target in graph[module] - reached:
            reached.add(target)
            todo.append(target)
    top_level = {m for m, path in SOURCES.items() if m.count(".") == 1 and path.name != "__init__.py"}
    assert sorted(m for m in reached - top_level if not m.startswith("rs_interp._backend")) == []


def test_no_private_name_across_packages():
    """A module imports another package's private names only from a private module of a package it is
    inside (``rs_interp.exact.validate`` serves every module; ``rs_interp.circuits._substrate`` only
    ``rs_interp.circuits``)."""
    offenders = []
    for module, path in SOURCES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            for target in _resolve(module, node, path.name == "__init__.py"):
                parts = target.split(".")
                private = [i for i, p in enumerate(parts) if p.startswith("_") and p != "__init__"]
                if not private:
                    continue
                owner = ".".join(parts[: private[0]])  # the package whose private module it is
                if not (module == owner or module.startswith(owner + ".")):
                    offenders.append((module, target))
    assert offenders == []


def test_library_modules_are_short():
    """One idea per module: every library module within ~400 lines."""
    long = {m: n for m, p in SOURCES.items() if (n := len(p.read_text().splitlines())) > 420}
    assert long == {}


@pytest.mark.parametrize("module", sorted(m for m in SOURCES if not m.startswith(("rs_interp.reproduce", "rs_interp.ui.cli"))))
def test_the_library_never_imports_the_reproduction(module):
    """One-way: the reproduction (rs_interp.reproduce) reads the library, never the other way, not
    even lazily. The command line (rs_interp.ui.cli) is the application on top of both."""
    assert [t for t in _graph()[module] if t.startswith("rs_interp.reproduce")] == []


@pytest.mark.parametrize("code", [
    "import rs_interp",
    "import rs_interp.models, rs_interp.tasks, rs_interp.reproduce; rs_interp.models.SHIPPED_MODELS; rs_interp.tasks.TASK_NAMES",
    "from rs_interp.ui.cli import main; main(['--help'])",
    "from rs_interp.ui.cli import main; main(['circuit', '--help'])",
    "from rs_interp.ui.cli import main; main(['reproduce', '--only', 'nosuch'])",
])
def test_the_package_and_the_command_line_load_without_torch(code):
    """``import rs_interp``, the catalogs and ``rs-interp ... --help`` (or an argument error) load neither
    torch nor TransformerLens: names are imported on first use (rs_interp._lazy), so the command line
    answers at once. Checked in a fresh interpreter, whose modules are then listed."""
    import subprocess
    import sys

    heavy = "('torch', 'transformer_lens', 'plotly')"
    probe = f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_lazy_name_is_the_defined_one():
    """The lazy names resolve to the objects their modules define (and unknown names raise AttributeError)."""
    import rs_interp
    from rs_interp.circuits.evaluation import faithfulness_curve
    from rs_interp.models.registry import load_toy_model

    assert rs_interp.faithfulness_curve is faithfulness_curve and rs_interp.models.load_toy_model is load_toy_model
    assert set(rs_interp.__all__) <= set(dir(rs_interp))
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        rs_interp.nosuch  # noqa: B018


@pytest.mark.parametrize("package", ["rs_interp", "rs_interp.models", "rs_interp.tasks", "rs_interp.scale", "rs_interp.reproduce"])
def test_no_lazy_name_is_shadowed_by_a_submodule(package):
    """Importing a submodule sets it as an attribute of its package: a lazily imported public name that
    is also a submodule's name (a function ``f`` defined in ``pkg/f.py``) would turn into the module once
    anything imports ``pkg.f``. So a public name is a submodule's name only when it *is* that
    subpackage (``rs_interp.tasks``)."""
    import importlib

    where = getattr(importlib.import_module(package), "_WHERE", None) or {"Context": ".context", "Section": ".context"}
    folder = ROOT / package.replace(".", "/")
    submodules = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    clashes = {name: module for name, module in where.items()
               if name in submodules and not (module == "." + name and (folder / name / "__init__.py").is_file())}
    assert clashes == {}


@pytest.mark.parametrize("old", ["attribution", "second_order", "paths", "lens", "tuned_lens", "composition", "copying",
                                 "ablation", "head_ablation", "plots", "circuit_figure", "cli", "circuit_command", "geometry"])
def test_a_moved_module_answers_to_its_old_name(old):
    """Issue 51 moved these modules into role packages; ``from rs_interp import <old>`` (a notebook's import)
    still gives the module, now under its package, and no file is left at the old place."""
    import importlib

    import rs_interp

    module = getattr(rs_interp, old)
    assert module.__name__.startswith("rs_interp.") and module.__name__.count(".") == 2, module.__name__
    assert module is importlib.import_module(module.__name__)
    assert not (ROOT / "rs_interp" / f"{old}.py").exists()
