"""Deprecated: GPT-2 configs and parameter counts moved to rs_interp.gpt2_config."""

from ._moved import forward

__getattr__ = forward("rs_interp.params", "rs_interp.gpt2_config")
