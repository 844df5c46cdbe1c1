"""The registry of circuit-discovery methods: one list that the ground truth, the reproduction, the
expected values and the benchmarks read.

A method is a name, a key (its entries in ``rs_interp.reproduce.expected``), a level (``"edge"``: it
scores every edge of the graph, an :class:`rs_interp.EdgeEffects`; ``"node"``: every head, a result
with ``labels`` and ``effect``; ``"positional"``: every positional edge, a
:class:`rs_interp.circuits.positions.PositionalEdgeEffects`, its ``run`` also taking ``spans=``, ``"each"`` or a
schema of the run's tokens) and a callable ``run(model, tokens, metric, *, reference, progress)``
(``shares``: it also takes ``per_example=True``, each pair's share for error bars).
Adding a method is its module, one entry here (or :func:`registered` for the duration, as a test
does), the export, its test and its reference entry.

>>> [m.key for m in METHODS.values()][:7]
['EAP', 'EAP-IG', 'exact', 'AtP', 'scan', 'EAP-QK', 'AtP*']
>>> [m.key for m in METHODS.values()][7:14]
['EAP-H', 'EAP-H2', 'EAP-IG-G2', 'EAP-H-fix', 'ACDC', 'AtP-GD', 'AtP-H']
>>> [m.key for m in METHODS.values()][14:]
['RelP', 'RelP-QK', 'RelP-IG-G2', 'RelP-fix', 'EAP-IG-G2-fix', 'EAP-pos', 'EAP-IG-pos', 'RelP-pos', 'exact-pos']
>>> METHODS["exact path patching"].exact, METHODS["EAP"].level
(True, 'edge')
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Literal

from ..heads.head_ablation import head_ablation_scan
from .acdc import acdc
from .correction import fix_unreliable
from .edge_attribution import edge_attribution_patching
from .graph import edge_layout
from .node_attribution import attribution_patching
from .options import EstimateOptions
from .path_patching import path_patching
from .relevance import edge_relevance_patching

__all__ = ["Method", "METHODS", "IG_STEPS", "HESSIAN_STEPS", "GAUSS_STEPS", "ACDC_FRACTION", "registered"]

#: EAP-IG's number of points in the registry's entry.
IG_STEPS = 5
#: The multi-step Hessian-corrected entry's points (the left rule, as EAP-IG's).
HESSIAN_STEPS = 2
#: Gauss-Legendre EAP-IG's points.
GAUSS_STEPS = 2
#: ACDC's threshold in the registry, as a fraction of |m(clean) - m(every edge ablated)| on the run.
ACDC_FRACTION = 0.02


@dataclass(frozen=True)
class Method:
    """One circuit-discovery method.

    Attributes:
        name: as shown in tables and figures (``"EAP-IG (m = 5)"``).
        key: its key in the expected values (``"EAP-IG"``): ``ground_truth.<model>.<key>``.
        level: ``"edge"`` (scores every edge) or ``"node"`` (every head).
        run: ``run(model, tokens, metric, *, reference, progress)`` -> the scores.
        exact: it measures the effect (the others are compared with it), rather than estimating it.
        shares: ``run`` also takes ``per_example=True`` (each pair's share: error bars, the bootstrap).
    """

    name: str
    key: str
    level: Literal["edge", "node", "positional"]
    run: Callable[..., Any]
    exact: bool = False
    shares: bool = False


def _edges(**options):
    """Edge attribution patching with the options of one :class:`EstimateOptions` (checked when the registry is
    built); ``per_example`` the caller's."""
    checked = EstimateOptions(**options)

    def run(model, tokens, metric, *, reference, progress=False, per_example=False):
        keywords = replace(checked, per_example=per_example).keywords()
        return edge_attribution_patching(model, tokens, metric, reference=reference, progress=progress, **keywords)
    return run


def _nodes(**options):
    """Node attribution patching with the options of one :class:`EstimateOptions`; ``per_example`` the caller's."""
    checked = EstimateOptions(**options)

    def run(model, tokens, metric, *, reference, progress=False, per_example=False):
        keywords = replace(checked, per_example=per_example).keywords()
        return attribution_patching(model, tokens, metric, reference=reference, progress=progress, **keywords)
    return run


def _fix(model, tokens, metric, *, reference, progress=False):
    screen = edge_attribution_patching(model, tokens, metric, reference=reference, progress=progress,
                                       **EstimateOptions(correction="hessian", per_example=True).keywords())
    return fix_unreliable(model, tokens, metric, screen, reference=reference, progress=progress)


def _acdc(model, tokens, metric, *, reference, progress=False):
    from .evaluation import evaluate_circuit

    empty = evaluate_circuit(model, tokens, metric, [], reference=reference)
    full = evaluate_circuit(model, tokens, metric, edge_layout(model).edges(), reference=reference)
    return acdc(model, tokens, metric, reference=reference, threshold=ACDC_FRACTION * abs(full - empty),
                progress=progress)


def _relp(**options):
    def run(model, tokens, metric, *, reference, progress=False, per_example=False):
        return edge_relevance_patching(model, tokens, metric, reference=reference, per_example=per_example,
                                       progress=progress, **options)
    return run


def _flat_fixed(estimate):
    """``estimate``'s flat edges patched exactly (:func:`rs_interp.fix_unreliable`, ``screen="flat"``)."""
    def run(model, tokens, metric, *, reference, progress=False):
        scores = estimate(model, tokens, metric, reference=reference, progress=progress)
        return fix_unreliable(model, tokens, metric, scores, reference=reference, screen="flat", progress=progress)
    return run


def _positional(fn, **options):
    """``fn``'s positional edges (``spans="each"`` unless the caller gives a schema)."""
    def run(model, tokens, metric, *, reference, progress=False, spans="each"):
        return fn(model, tokens, metric, reference=reference, progress=progress, spans=spans, **options).positional()
    return run


def _exact(model, tokens, metric, *, reference, progress=False):
    return path_patching(model, tokens, metric, reference=reference, progress=progress)


def _scan(model, tokens, metric, *, reference, progress=False):
    return head_ablation_scan(model, tokens, metric, ablation="resample", reference=reference, progress=progress)


#: Every method, by name, in the order of the tables.
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("EAP", "EAP", "edge", _edges(), shares=True),
    Method(f"EAP-IG (m = {IG_STEPS})", "EAP-IG", "edge", _edges(ig_steps=IG_STEPS), shares=True),
    Method("exact path patching", "exact", "edge", _exact, exact=True),
    Method("attribution patching (heads)", "AtP", "node", _nodes(), shares=True),
    Method("ablation scan (heads)", "scan", "node", _scan, exact=True),
    Method("EAP, QK fix", "EAP-QK", "edge", _edges(qk_fix=True), shares=True),
    Method("AtP* (QK fix, GradDrop)", "AtP*", "edge", _edges(qk_fix=True, grad_drop=True)),
    Method("EAP, Hessian-corrected", "EAP-H", "edge", _edges(correction="hessian"), shares=True),
    Method(f"EAP-IG, Hessian-corrected (m = {HESSIAN_STEPS})", "EAP-H2", "edge",
           _edges(correction="hessian", ig_steps=HESSIAN_STEPS), shares=True),
    Method(f"EAP-IG, Gauss-Legendre (m = {GAUSS_STEPS})", "EAP-IG-G2", "edge",
           _edges(ig_steps=GAUSS_STEPS, ig_rule="gauss"), shares=True),
    Method("EAP, Hessian-corrected, unreliable edges patched", "EAP-H-fix", "edge", _fix),
    Method(f"ACDC (threshold {ACDC_FRACTION:g} of clean - empty)", "ACDC", "edge", _acdc, exact=True),
    Method("attribution patching, GradDrop (heads)", "AtP-GD", "node", _nodes(grad_drop=True)),
    Method("attribution patching, Hessian-corrected (heads)", "AtP-H", "node", _nodes(correction="hessian"),
           shares=True),
    Method("RelP", "RelP", "edge", _relp(), shares=True),
    Method("RelP, QK fix", "RelP-QK", "edge", _relp(qk_fix=True), shares=True),
    Method(f"RelP-IG, Gauss-Legendre (m = {GAUSS_STEPS})", "RelP-IG-G2", "edge", _relp(ig_steps=GAUSS_STEPS),
           shares=True),
    Method("RelP, flat edges patched", "RelP-fix", "edge", _flat_fixed(_relp())),
    Method(f"EAP-IG, Gauss-Legendre (m = {GAUSS_STEPS}), flat edges patched", "EAP-IG-G2-fix", "edge",
           _flat_fixed(_edges(ig_steps=GAUSS_STEPS, ig_rule="gauss"))),
    Method("EAP (positions)", "EAP-pos", "positional", _positional(edge_attribution_patching)),
    Method(f"EAP-IG (m = {IG_STEPS}, positions)", "EAP-IG-pos", "positional",
           _positional(edge_attribution_patching, ig_steps=IG_STEPS)),
    Method("RelP (positions)", "RelP-pos", "positional", _positional(edge_relevance_patching)),
    Method("exact path patching (positions)", "exact-pos", "positional", _positional(path_patching), exact=True),
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
