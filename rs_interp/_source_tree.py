"""``rs_interp.hooks`` when rs_interp runs from its source tree.

The hook factories live in the top-level folder ``hooks/`` (the project's layout), which an install
puts at ``rs_interp/hooks`` (setup.py's ``package_dir``). Run from a clone instead (a notebook saved in
the clone, ``python -c "import rs_interp"`` there, the docs build), the folder ``rs_interp/`` of the
clone is the package and has no ``hooks``: this loads the clone's ``hooks/`` as ``rs_interp.hooks``,
once, before the package imports it. An installed rs_interp (``rs_interp/hooks`` present) is left alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__: list[str] = []


def load_hooks_from_the_source_tree() -> None:
    """Register the clone's ``hooks/`` as ``rs_interp.hooks`` where the package has none of its own."""
    package = Path(__file__).resolve().parent
    source = package.parent / "hooks" / "__init__.py"
    if (package / "hooks").is_dir() or "rs_interp.hooks" in sys.modules or not source.is_file():
        return
    if importlib.util.find_spec("rs_interp.hooks") is not None:  # an editable install maps it already
        return
    spec = importlib.util.spec_from_file_location("rs_interp.hooks", source, submodule_search_locations=[str(source.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["rs_interp.hooks"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["rs_interp.hooks"]
        raise
