"""Tests of rs_interp.lab: test_<module>.py tests rs_interp/lab/<module>.py."""
