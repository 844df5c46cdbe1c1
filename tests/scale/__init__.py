"""Tests of rs_interp.scale: test_<module>.py tests rs_interp/scale/<module>.py."""
