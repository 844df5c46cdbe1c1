"""Tests of rs_interp.circuits: test_<module>.py tests rs_interp/circuits/<module>.py."""
