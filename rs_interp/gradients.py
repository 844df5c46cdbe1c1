"""Deprecated: The gradient table moved to rs_interp.reproduce.gradients."""

from ._moved import forward

__getattr__ = forward("rs_interp.gradients", "rs_interp.reproduce.gradients")
