"""Tests of rs_interp._backend: test_<module>.py tests rs_interp/_backend/<module>.py."""
