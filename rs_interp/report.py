"""Deprecated: The report writers moved to rs_interp.reproduce.report."""

from ._moved import forward

__getattr__ = forward("rs_interp.report", "rs_interp.reproduce.report")
