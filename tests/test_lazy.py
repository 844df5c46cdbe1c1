"""The public names (rs_interp._lazy): what is at the top level by the rule of docs/getting-started.md ("What
is where"), and the names that left it (issue 51), which answer for a release with a warning naming their
new place and are in neither ``__all__`` nor ``dir()``."""

from __future__ import annotations

import importlib
import json
import re
import warnings
from pathlib import Path

import pytest

import rs_interp
import rs_interp.models

ROOT = Path(__file__).resolve().parent.parent

#: What ``rs_interp.models`` shares with the top level: loading a model by what one has and checking it,
#: the induction data, scoring. Everything else there builds, configures, trains, saves or ships a model.
NOTEBOOK_MODELS_NAMES = {
    "load_toy_model", "load_gpt2", "load_pretrained", "WeightsUnavailable", "GPT2WeightsUnavailable", "as_dtype",
    "count_parameters", "induction_batch", "next_token_targets", "score_model", "score_logits",
}


def test_the_top_level_holds_no_maintainer_name():
    """Of ``rs_interp.models``'s names, the top level has exactly the ones a notebook calls; the rest are
    ``rs_interp.models.NAME`` only (and the package itself is public, beside tasks, features, scale, hooks)."""
    shared = set(rs_interp.models.__all__) & set(rs_interp.__all__)
    assert shared == NOTEBOOK_MODELS_NAMES
    assert {"models", "tasks", "features", "scale", "hooks"} <= set(rs_interp.__all__)
    assert len(rs_interp.__all__) == len(set(rs_interp.__all__)) == len(rs_interp._WHERE) == 68 <= 70  # issue 65
    assert set(rs_interp._DEPRECATED) & set(rs_interp.__all__) == set()


@pytest.mark.parametrize("package, old", [("rs_interp", name) for name in rs_interp._DEPRECATED]
                         + [("rs_interp.models", "evaluate"), ("rs_interp.models.training", "evaluate")])
def test_a_name_that_left_answers_with_a_warning_naming_its_place(package, old):
    """``rs_interp.Trained`` is ``rs_interp.models.Trained``, with a DeprecationWarning (a maintainer's name)
    or a FutureWarning (``evaluate``, renamed ``score_model``) naming the new place; on every use (it is never
    cached), from ``getattr`` and from ``from ... import``; never in ``__all__`` or ``dir()``."""
    module = importlib.import_module(package)
    new, category = getattr(module, "_DEPRECATED", {}).get(old) or (f"{package}.score_model", FutureWarning)
    where, _, name = new.rpartition(".")
    expected = getattr(importlib.import_module(where), name)
    for _ in range(2):
        with pytest.warns(category, match=re.escape(f"{package}.{old} is now {new}")):
            assert getattr(module, old) is expected
    with pytest.warns(category, match=re.escape(new)):
        exec(f"from {package} import {old}", {})
    assert old not in dir(module) and old not in getattr(module, "__all__", ()) and old not in vars(module)


def test_an_unknown_name_is_an_attribute_error_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module in (rs_interp, rs_interp.models, importlib.import_module("rs_interp.models.training")):
            with pytest.raises(AttributeError, match="has no attribute 'nosuch'"):
                module.nosuch  # noqa: B018


@pytest.mark.parametrize("new", sorted(set(rs_interp._MOVED.values())))
def test_a_moved_module_answers_at_its_new_place(new):
    """Issue 61: ``ri.ui.plots`` answers, as ``from rs_interp.ui import plots`` does, also where nothing imported the
    module yet: the attribute Python sets on the package at the import is removed first, so the package's own
    ``__getattr__`` answers (it did not exist: an AttributeError); a dunder or a missing name stays an
    AttributeError."""
    package_name, name = new.strip(".").split(".")
    module = importlib.import_module("rs_interp" + new)
    package = getattr(rs_interp, package_name)
    delattr(package, name)  # as in a fresh interpreter: no attribute until asked for
    try:
        assert getattr(package, name) is module and name in dir(package)
    finally:
        setattr(package, name, module)
    assert not hasattr(package, "nosuch") and not hasattr(package, "__wrapped__")


def _sources() -> dict[str, str]:
    out = {}
    for pattern in ("*.md", "*.py", "*.ipynb"):
        for path in ROOT.rglob(pattern):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith((".", "build/")) or "/." in rel or rel == "tests/test_lazy.py":
                continue
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".ipynb":
                cells = json.loads(text)["cells"]
                text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
            out[rel] = text
    return out


def test_nothing_in_the_repository_uses_an_old_name():
    """The notebooks, pages, README, tests, benchmarks and the library call the names where they are now:
    nothing in the repository triggers the warning of a name that left the top level."""
    old = "|".join(rs_interp._DEPRECATED)
    uses = [re.compile(rf"(?<![\w.])(?:ri|rs_interp)\.(?:{old})\b"),
            re.compile(r"from rs_interp(?:\.models(?:\.training)?)? import [^\n]*\bevaluate\b(?!_)"),
            re.compile(rf"from rs_interp import [\w, ]*\b(?:{old})\b(?!_)")]
    found = {rel: m.group(0) for rel, text in _sources().items() for use in uses if (m := use.search(text))}
    assert found == {}


def test_the_type_checking_imports_name_exactly_the_public_names_from_their_modules():
    """``rs_interp/__init__.py`` names each public name three times, each for a reader that cannot use the
    others: ``_WHERE`` (the lazy import), the ``if TYPE_CHECKING:`` imports (type checkers, and griffe for
    the documentation) and the literal ``__all__`` (griffe and ruff read only a literal list). They must
    agree, names and modules, or a new name would be documented from the wrong place or not at all."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(rs_interp.__file__)).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            # ``from . import tasks``: ".tasks"
            imported[alias.asname or alias.name] = "." + (node.module or alias.name)
    assert sorted(rs_interp.__all__) == sorted(rs_interp._WHERE)
    assert imported == rs_interp._WHERE
