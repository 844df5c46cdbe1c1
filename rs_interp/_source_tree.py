"""``rs_interp.hooks`` when rs_interp runs from its source tree.

The hook factories live in the top-level folder ``hooks/`` (the project's layout), which an install
puts at ``rs_interp/hooks`` (setup.py's ``package_dir``). Run from a clone instead (a notebook saved in
the clone, ``python -c "import rs_interp"`` there, the docs build), the folder ``rs_interp/`` of the
clone is the package and has no ``hooks``: a finder maps ``rs_interp.hooks`` to the clone's ``hooks/``
(found when first imported, never before). An installed rs_interp (``rs_interp/hooks`` present) and an
editable install (which maps it already) are left alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__all__: list[str] = []


class _HooksFinder(importlib.abc.MetaPathFinder):
    """Finds ``rs_interp.hooks`` in ``folder`` (its submodules then by the package's path)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, fullname, path, target=None):
        if fullname != "rs_interp.hooks":
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / "__init__.py",
                                                      submodule_search_locations=[str(self.folder)])


def register_hooks_of_the_source_tree() -> None:
    """Map ``rs_interp.hooks`` to the clone's ``hooks/`` where the package has none of its own."""
    package = Path(__file__).resolve().parent
    folder = package.parent / "hooks"
    if (package / "hooks").is_dir() or not (folder / "__init__.py").is_file():
        return
    if any(isinstance(f, _HooksFinder) for f in sys.meta_path):
        return
    sys.meta_path.append(_HooksFinder(folder))  # last: an editable install's own finder answers first
