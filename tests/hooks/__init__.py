"""Tests of the top-level hooks/ package (installed as rs_interp.hooks)."""
