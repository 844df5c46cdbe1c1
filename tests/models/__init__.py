"""Tests of rs_interp.models: test_<module>.py tests rs_interp/models/<module>.py."""
