"""Tests of rs_interp.reproduce: test_<module>.py tests rs_interp/reproduce/<module>.py."""
