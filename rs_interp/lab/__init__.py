"""The theory lab, apart from the library's analyses: :mod:`.geometry` (attention collapse and the skip,
LayerNorm, the identity path). Importing this package loads nothing heavy."""

from .._lazy import attach

#: Every submodule answers as an attribute (``rs_interp.lab.geometry``), imported on first use.
__getattr__, __dir__ = attach(__name__, {}, globals())
