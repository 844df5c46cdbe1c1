"""Issue 51 item 4: tests/ mirrors the package tree, so a module's tests are found from its path
(docs/project/testing.md, "Where a test lives"): ``tests/<package>/test_<module>[_<aspect>].py`` for
``rs_interp/<package>/<module>.py`` (``test_<package>.py`` for the package as a whole), ``tests/test_<module>.py``
for a top-level module, ``tests/hooks/`` for the top-level hooks/ package, ``tests/integration/`` for the library
as a whole, and at the top of tests/ only the shared helpers."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: the shared pieces at the top of tests/ (conftest's fixtures, the helpers every folder imports as tests.<name>)
HELPERS = {"__init__", "conftest", "builders", "finite_differences", "hf_families", "mutations", "browser"}


def _modules(folder: Path) -> set[str]:
    """The names a test file in the mirror of ``folder`` may start with: its modules (without a leading
    underscore) and its subpackages, and the package's own name."""
    names = {p.stem.lstrip("_") for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return names | {folder.name}


def _names_a_module(test: Path, modules: set[str]) -> bool:
    stem = test.stem.removeprefix("test_")
    return any(stem == m or stem.startswith(m + "_") for m in modules)


def test_every_folder_mirrors_a_package():
    """Each folder of tests/ (but data/ and integration/) is a package of rs_interp or the top-level hooks/,
    and is a package itself (``__init__.py``: files of the same name in two folders, helpers as ``tests.builders``)."""
    folders = sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in {"data", "__pycache__"})
    assert {f.name for f in folders} >= {"circuits", "features", "integration"}
    for folder in folders:
        assert (folder / "__init__.py").is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"
        if folder.name != "integration":
            package = ROOT / "hooks" if folder.name == "hooks" else ROOT / "rs_interp" / folder.name
            assert (package / "__init__.py").is_file(), f"tests/{folder.name}/ mirrors no package of rs_interp"
    assert (TESTS / "__init__.py").is_file()


def test_every_test_file_names_its_module():
    """A test file in tests/<package>/ is named after one of that package's modules (or the package); one at the
    top of tests/ after a top-level module of rs_interp; nothing else but the helpers sits at the top."""
    wrong = []
    for test in sorted(TESTS.glob("*/test_*.py")):
        folder = test.parent.name
        if folder == "integration":
            continue
        package = ROOT / "hooks" if folder == "hooks" else ROOT / "rs_interp" / folder
        if not _names_a_module(test, _modules(package)):
            wrong.append(test.relative_to(ROOT).as_posix())
    top = {p.stem.lstrip("_") for p in (ROOT / "rs_interp").glob("*.py") if p.stem != "__init__"}
    for path in sorted(TESTS.glob("*.py")):
        if path.stem in HELPERS:
            continue
        if not (path.stem.startswith("test_") and _names_a_module(path, top)):
            wrong.append(path.relative_to(ROOT).as_posix())
    assert not wrong, f"test files not named after a module of the folder they mirror: {wrong}"
