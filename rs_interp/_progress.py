"""Progress bars: on by default, drawn only once the work has run a couple of seconds, in a notebook or a
terminal, and never a warning at import.

``tqdm.auto`` picks Jupyter's widget bar and warns ("IProgress not found") in a kernel without
``ipywidgets``, as soon as it is imported: so nothing imports tqdm until a bar is asked for, and the
widget bar is used only where ``ipywidgets`` is installed (else the text bar, which a notebook shows too).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Iterable

__all__: list[str] = []

#: Seconds of work before a bar appears: short calls stay quiet.
DELAY = 2.0


def _tqdm() -> type:
    if "ipykernel" in sys.modules and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


def bar(iterable: Iterable[Any] | None = None, *, desc: str, enabled: bool = True, total: int | None = None,
        unit: str = "it"):
    """A progress bar over ``iterable`` (or a manual one of ``total`` steps), drawn after :data:`DELAY`
    seconds, with a count and an estimate of the time left; nothing where ``enabled`` is False.

    >>> list(bar(range(3), desc="work"))
    [0, 1, 2]
    """
    return _tqdm()(iterable, desc=desc, total=total, disable=not enabled, leave=False, delay=DELAY, unit=unit,
                   dynamic_ncols=True)
