"""The one norm (:class:`Norm`: apply, frozen scale, affine with the backend's gain convention, input gradient),
defined in the substrate below every package (``rs_interp._norm``, torch alone), so that the backend builds a
model's norms without importing the exact core; here is where users import it.

>>> from rs_interp.exact.norm import IDENTITY
>>> IDENTITY.kind is None
True
"""

from __future__ import annotations

from .._norm import IDENTITY, KINDS, Norm

__all__ = ["Norm", "KINDS", "IDENTITY"]
