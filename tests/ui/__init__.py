"""Tests of rs_interp.ui: test_<module>.py tests rs_interp/ui/<module>.py."""
