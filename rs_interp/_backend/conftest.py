"""pytest only: the doctests of the installed TransformerLens version's module are collected, the
other version's module cannot be imported."""

from rs_interp._backend.common import TL_MAJOR

collect_ignore = ["tl3.py" if TL_MAJOR >= 4 else "tl4.py"]
