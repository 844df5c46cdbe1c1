"""Modules that moved keep their old names working, with a DeprecationWarning that says where to."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable

__all__: list[str] = []


def forward(old: str, new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` that serves every name from ``new`` (imported on first use)."""

    def __getattr__(name: str) -> Any:
        value = getattr(importlib.import_module(new), name)  # AttributeError for names it does not have
        warnings.warn(f"{old} moved to {new}: import {name} from {new}", DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
