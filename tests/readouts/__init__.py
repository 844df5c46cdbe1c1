"""Tests of rs_interp.readouts: test_<module>.py tests rs_interp/readouts/<module>.py."""
