"""Renamed keyword arguments: the old spelling keeps working for one release, with a warning.

One decorator for every public helper whose argument was renamed to the one vocabulary of
``docs/getting-started.md`` ("The vocabulary"): ``old=`` becomes ``new=`` and a
``DeprecationWarning`` names the new keyword. Every such warning starts with ``"rs_interp: "`` (so
``-W "error:rs_interp:DeprecationWarning"`` turns the repo's own uses into errors). Positions never change (a renamed
argument keeps its place), so a positional call means what it meant.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, TypeVar

__all__: list[str] = []

F = TypeVar("F", bound=Callable[..., Any])


def renamed(**old_to_new: str) -> Callable[[F], F]:
    """Accept each ``old`` keyword as ``old_to_new[old]``, warning (``DeprecationWarning``) that it
    is deprecated; both spellings at once are a ``TypeError``. The wrapped function's signature (and
    ``inspect.signature``) shows the new names only; ``__renamed__`` records the map.

    >>> @renamed(top_k="k")
    ... def f(x, *, k=5):
    ...     return x, k
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     f(1, top_k=3), str(w[0].message)
    ((1, 3), "rs_interp: f(): the keyword 'top_k' is deprecated (removed in the next release): use 'k'")
    >>> f(1, k=2)
    (1, 2)
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got both {old!r} (deprecated) and {new!r}: give {new!r} only")
                    warnings.warn(f"rs_interp: {fn.__name__}(): the keyword {old!r} is deprecated (removed in the next "
                                  f"release): use {new!r}", DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        inner.__renamed__ = {**getattr(fn, "__renamed__", {}), **old_to_new}  # type: ignore[attr-defined]
        return inner  # type: ignore[return-value]

    return wrap


def renamed_attribute(old: str, new: str) -> property:
    """A result's attribute ``old``, renamed ``new``: reading ``old`` still works for one release,
    with a ``DeprecationWarning`` naming ``new`` (put it in the class body as ``old = renamed_attribute(old, new)``).

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class R:
    ...     k: int
    ...     top_k = renamed_attribute("top_k", "k")
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     R(3).top_k, str(w[0].message)
    (3, 'rs_interp: R.top_k is deprecated (removed in the next release): use R.k')
    """

    def get(self: Any) -> Any:
        name = type(self).__name__
        warnings.warn(f"rs_interp: {name}.{old} is deprecated (removed in the next release): use {name}.{new}",
                      DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    return property(get, doc=f"Deprecated: :attr:`{new}`.")
