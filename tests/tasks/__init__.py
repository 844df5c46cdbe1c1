"""Tests of rs_interp.tasks: test_<module>.py tests rs_interp/tasks/<module>.py."""
