"""Tests of rs_interp.exact: test_<module>.py tests rs_interp/exact/<module>.py."""
