"""pytest only: the doctests of the installed TransformerLens version's modules are collected, the
other version's modules cannot be imported."""

import pathlib

from rs_interp._backend.common import TL_MAJOR

_OTHER = ("tl3", "_tl3") if TL_MAJOR >= 4 else ("tl4", "_tl4")
collect_ignore = sorted(p.name for p in pathlib.Path(__file__).parent.glob("*.py") if p.stem.startswith(_OTHER))
