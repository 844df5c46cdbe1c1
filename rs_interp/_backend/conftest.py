"""pytest only: the doctests of the installed TransformerLens version's modules are collected, the
other version's modules cannot be imported."""

from rs_interp._backend.common import TL_MAJOR

collect_ignore = ["tl3.py"] if TL_MAJOR >= 4 else ["tl4.py", "_tl4_native.py"]
