"""The wheel and the sdist hold the whole tree, and the installed wheel works on its own.

The suite runs on an editable install, which reads the source tree and never sees what a
``pip install .`` ships; this test builds both distributions from a copy of the tree (setuptools'
``build_meta``, no build isolation, no network), checks that every ``.py`` and data file under
``rs_interp/`` and ``hooks/`` is in them (the file list is read from the tree, so a new module,
subpackage or checkpoint is checked with no edit here), installs the wheel with ``pip install
--target`` into a directory the editable install cannot shadow, and runs the command line from it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What a build reads besides the two package folders.
BUILD_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
#: Folders whose files ship: the source folder -> its place in the installed package.
SHIPPED = {"rs_interp": "rs_interp", "hooks": "rs_interp/hooks"}


def _ignored(path: Path) -> bool:
    """Compiled files, build records and test scaffolding (a ``conftest.py``: pytest reads it from the source)."""
    return path.name == "conftest.py" or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo") or any(p.endswith(".egg-info") for p in path.parts)


def tree_files() -> dict[str, str]:
    """Every file of the tree that must ship: its path in the source -> its path in the wheel."""
    out = {}
    for folder, target in SHIPPED.items():
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT / folder)
            if path.is_file() and not _ignored(rel):
                out[f"{folder}/{rel.as_posix()}"] = f"{target}/{rel.as_posix()}"
    return out


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "RS_INTERP_"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, built from a copy of the tree (the worktree gets no build/ or egg-info)."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, src / name)
    for folder in SHIPPED:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    dist = tmp / "dist"
    dist.mkdir()
    # build_meta rewrites sys.argv as it runs: read the output folder first.
    script = ("import sys\nfrom setuptools import build_meta as b\nout = sys.argv[1]\n"
              "names = [b.build_sdist(out), b.build_wheel(out)]\n"
              "print('BUILT', *names)\n")
    run = subprocess.run([sys.executable, "-c", script, str(dist)], cwd=src, env=_clean_env(), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    sdist_name, wheel_name = next(line for line in run.stdout.splitlines() if line.startswith("BUILT ")).split()[1:]
    return {"sdist": dist / sdist_name, "wheel": dist / wheel_name, "tmp": tmp}


def test_tree_has_files_to_check():
    """The walk finds the package's modules and data (else the checks below would check nothing)."""
    files = tree_files()
    assert "rs_interp/__init__.py" in files and "hooks/__init__.py" in files
    assert files["hooks/__init__.py"] == "rs_interp/hooks/__init__.py"
    assert any(f.startswith("rs_interp/toy_models/") and f.endswith(".safetensors") for f in files)
    assert any(f.startswith("rs_interp/reproduce/sections/") for f in files)


def test_wheel_holds_every_file(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    missing = sorted(src for src, dst in tree_files().items() if dst not in names)
    assert not missing, f"not in the wheel: {missing}"
    # hooks/ is rs_interp.hooks, never a global `hooks` package; nothing compiled ships.
    assert not [n for n in names if n.startswith("hooks/")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.endswith("conftest.py")]  # test scaffolding (rs_interp/_backend's) never ships
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "rs-interp = rs_interp.ui.cli:main" in zipfile.ZipFile(built["wheel"]).read(entry_points).decode()


def test_wheel_declares_every_import(built):
    """Every third-party package the library imports is a declared dependency."""
    import ast

    names = zipfile.ZipFile(built["wheel"]).namelist()
    meta = zipfile.ZipFile(built["wheel"]).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    declared = {line.split(":", 1)[1].strip().split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("!")[0].split("<")[0]
                .strip().lower().replace("-", "_") for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line}
    imported = set()
    for src in tree_files():
        if src.endswith(".py"):
            for node in ast.walk(ast.parse((ROOT / src).read_text())):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "rs_interp"}
    assert {"torch", "tokenizers", "huggingface_hub"} <= third_party  # the walk sees the imports
    assert not sorted(third_party - declared), f"imported but not declared: {sorted(third_party - declared)}"


def test_sdist_holds_every_file(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = sorted(src for src in tree_files() if src not in names)
    assert not missing, f"not in the sdist: {missing}"
    assert {"pyproject.toml", "setup.py", "MANIFEST.in", "README.md"} <= names
    assert not [n for n in names if n.endswith("conftest.py")]  # test scaffolding never ships


@pytest.fixture(scope="module")
def installed(built) -> Path:
    """The wheel installed non-editably (``pip install --target``), as a user's venv holds it."""
    target = built["tmp"] / "site"
    if not target.exists():
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--target", str(target),
                              str(built["wheel"])], env=_clean_env(), capture_output=True, text=True)
        assert pip.returncode == 0, pip.stderr[-3000:]
    return target


@pytest.mark.parametrize("where", ["the clone's root", "notebooks/"])
def test_the_installed_wheel_imports_from_inside_the_clone(installed, where):
    """Issue 42: a notebook saved in the clone (its kernel's working directory first on the path) imports
    rs_interp with rs_interp.hooks, although the clone's rs_interp/ shadows the installed package there
    and has no hooks/ of its own (they install from the top-level hooks/)."""
    cwd = ROOT if where == "the clone's root" else ROOT / "notebooks"
    script = ("import json, rs_interp, rs_interp.hooks\n"
              "print(json.dumps([rs_interp.__file__, rs_interp.hooks.__file__, callable(rs_interp.hooks.store)]))")
    run = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=_clean_env(PYTHONPATH=str(installed)), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    init, hooks_init, ok = json.loads(run.stdout)
    assert ok and Path(hooks_init).name == "__init__.py"
    # from the root the clone's package is the one imported (the shadowing the fix is for), its hooks the clone's
    assert Path(init).resolve().is_relative_to(ROOT if where == "the clone's root" else installed.resolve())
    assert Path(hooks_init).resolve().parent.name == "hooks"


@pytest.mark.slow
def test_installed_wheel_runs(built, installed):
    """``pip install --target`` (non-editable), then ``rs-interp --help`` and ``reproduce --only induction``
    from a directory outside the repository, with the wheel's copy first on the path."""
    tmp, target = built["tmp"], installed
    work = tmp / "work"
    work.mkdir()
    env = _clean_env(PYTHONPATH=str(target))
    where = subprocess.run([sys.executable, "-c", "import json, rs_interp, rs_interp.hooks, rs_interp.reproduce.sections, importlib.util\n"
                            "print(json.dumps([rs_interp.__file__, rs_interp.hooks.__file__, importlib.util.find_spec('hooks') is None]))"],
                           cwd=work, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr[-3000:]
    init, hooks_init, no_global_hooks = json.loads(where.stdout)
    assert Path(init).resolve().is_relative_to(target.resolve()), init
    assert Path(hooks_init).resolve().is_relative_to(target.resolve()), hooks_init
    assert no_global_hooks
    cli = target / "bin" / "rs-interp"
    assert cli.exists()
    help_ = subprocess.run([str(cli), "--help"], cwd=work, env=env, capture_output=True, text=True)
    assert help_.returncode == 0, help_.stderr[-3000:]
    assert "reproduce" in help_.stdout
    out = tmp / "out"
    rep = subprocess.run([str(cli), "reproduce", "--only", "induction", "--quiet", "--out", str(out)], cwd=work, env=env,
                         capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert "induction" in results
    assert (out / "report.html").stat().st_size > 0
