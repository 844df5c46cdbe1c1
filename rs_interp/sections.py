"""Deprecated: The theory's tables moved to rs_interp.reproduce (registry) and rs_interp.reproduce.sections."""

from ._moved import forward

__getattr__ = forward("rs_interp.sections", "rs_interp.reproduce")
