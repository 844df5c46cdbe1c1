"""Tests of rs_interp.heads: test_<module>.py tests rs_interp/heads/<module>.py."""
