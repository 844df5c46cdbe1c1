"""The registry of circuit-discovery methods: one list that the ground truth, the reproduction, the
expected values and the benchmarks read.

A method is a name, a key (its entries in ``rs_interp.reproduce.expected``), a level (``"edge"``: it
scores every edge of the graph, an :class:`rs_interp.EdgeEffects`; ``"node"``: every head, a result
with ``labels`` and ``effect``) and a callable ``run(model, tokens, metric, *, reference, progress)``.
Adding a method is its module, one entry here (or :func:`registered` for the duration, as a test
does), the export, its test and its reference entry.

>>> [m.key for m in METHODS.values()]
['EAP', 'EAP-IG', 'exact', 'AtP', 'scan']
>>> METHODS["exact path patching"].exact, METHODS["EAP"].level
(True, 'edge')
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal

from ..head_ablation import head_ablation_scan
from .edge_attribution import edge_attribution_patching
from .node_attribution import attribution_patching
from .path_patching import path_patching

__all__ = ["Method", "METHODS", "IG_STEPS", "registered"]

#: EAP-IG's number of points in the registry's entry.
IG_STEPS = 5


@dataclass(frozen=True)
class Method:
    """One circuit-discovery method.

    Attributes:
        name: as shown in tables and figures (``"EAP-IG (m = 5)"``).
        key: its key in the expected values (``"EAP-IG"``): ``ground_truth.<model>.<key>``.
        level: ``"edge"`` (scores every edge) or ``"node"`` (every head).
        run: ``run(model, tokens, metric, *, reference, progress)`` -> the scores.
        exact: it measures the effect (the others are compared with it), rather than estimating it.
    """

    name: str
    key: str
    level: Literal["edge", "node"]
    run: Callable[..., Any]
    exact: bool = False


def _eap(model, tokens, metric, *, reference, progress=False):
    return edge_attribution_patching(model, tokens, metric, reference=reference)


def _eap_ig(model, tokens, metric, *, reference, progress=False):
    return edge_attribution_patching(model, tokens, metric, reference=reference, ig_steps=IG_STEPS, progress=progress)


def _exact(model, tokens, metric, *, reference, progress=False):
    return path_patching(model, tokens, metric, reference=reference, progress=progress)


def _atp(model, tokens, metric, *, reference, progress=False):
    return attribution_patching(model, tokens, metric, reference=reference)


def _scan(model, tokens, metric, *, reference, progress=False):
    return head_ablation_scan(model, tokens, metric, method="resample", reference=reference, progress=progress)


#: Every method, by name, in the order of the tables.
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("EAP", "EAP", "edge", _eap),
    Method(f"EAP-IG (m = {IG_STEPS})", "EAP-IG", "edge", _eap_ig),
    Method("exact path patching", "exact", "edge", _exact, exact=True),
    Method("attribution patching (heads)", "AtP", "node", _atp),
    Method("ablation scan (heads)", "scan", "node", _scan, exact=True),
)}


@contextlib.contextmanager
def registered(method: Method) -> Iterator[Method]:
    """``method`` in :data:`METHODS` for the duration (a test's toy method, a user's experiment).

    Raises:
        ValueError: a method of that name is registered already.
    """
    if method.name in METHODS:
        raise ValueError(f"a method named {method.name!r} is registered already")
    METHODS[method.name] = method
    try:
        yield method
    finally:
        METHODS.pop(method.name, None)
