"""Tests of rs_interp.finance: test_<module>.py tests rs_interp/finance/<module>.py."""
