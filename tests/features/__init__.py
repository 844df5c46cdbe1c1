"""Tests of rs_interp.features: test_<module>.py tests rs_interp/features/<module>.py."""
