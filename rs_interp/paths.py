"""Deprecated: Theorem 3's path expansion moved to rs_interp.path_expansion, direct logit attribution to rs_interp.attribution."""

from ._moved import forward

_path_expansion = forward("rs_interp.paths", "rs_interp.path_expansion")
_attribution = forward("rs_interp.paths", "rs_interp.attribution")


def __getattr__(name: str):
    return (_attribution if name in ("DirectLogitAttribution", "direct_logit_attribution") else _path_expansion)(name)
