"""How numbers print: what a notebook shows of a result (the values themselves stay exact floats)."""

from __future__ import annotations

from typing import Any


def short(x: float) -> str:
    """``x`` to 4 significant digits, ``-0.0`` printed as ``0``.

    >>> short(0.10323456), short(-0.0), short(-1.5e-7), short(12345.6)
    ('0.1032', '0', '-1.5e-07', '1.235e+04')
    """
    return f"{float(x) + 0.0:.4g}"  # + 0.0 turns -0.0 into 0.0


class Top(list):
    """A ``.top(k)`` answer: a list of ``(label, value)`` tuples (or ``(label, value, value)``), best
    first. It is a plain list of exact floats; only its printed form rounds them (:func:`short`).

    >>> r = Top([("L0H0", 4.731234), (("embed", "L1H0.q"), -0.0)])
    >>> r
    [('L0H0', 4.731), (('embed', 'L1H0.q'), 0)]
    >>> r[0][1], r == [("L0H0", 4.731234), (("embed", "L1H0.q"), 0.0)]
    (4.731234, True)
    """

    def __repr__(self) -> str:
        return "[" + ", ".join(_entry(e) for e in self) + "]"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's display: the same short form
        printer.text(repr(self))


def _entry(entry: Any) -> str:
    if not isinstance(entry, tuple):
        return repr(entry)
    parts = [short(v) if isinstance(v, float) else repr(v) for v in entry]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
