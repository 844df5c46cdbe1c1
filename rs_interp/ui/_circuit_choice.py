"""How ``rs-interp circuit`` chooses its circuit without ``--size`` (private; :mod:`rs_interp.ui.circuit_command` runs
it): the smallest circuit on the faithfulness curve that recovers a share of the metric, refined by bisection, and
the sentence that says how a circuit was chosen.
"""

from __future__ import annotations

from typing import Any

__all__ = ["smallest_circuit", "chosen", "on_the_curve"]


def smallest_circuit(model: Any, task: Any, scores: Any, curve: Any, share: float, runs: tuple[float, float],
                     kw: dict) -> tuple[int, Any, float, tuple[tuple[int, int, float], ...]]:
    """The smallest circuit on the faithfulness curve recovering ``share`` of the metric: the curve's first
    point at or above it (:func:`~rs_interp.circuits.selection.smallest_recovering`), then bisection on the
    edge budget between the curve's point below it and that one, each circuit chosen as the curve chooses
    (:func:`~rs_interp.circuits.selection.circuit_at`, pruned). Returns (budget, mask, metric, the
    bisection's (budget, edges, faithfulness))."""
    from .. import scale
    from ..circuits.selection import circuit_at, mib_weights, smallest_recovering

    full, empty = runs
    k = smallest_recovering(curve, share)
    hi, lo = curve.n_requested[k], max((r for r in curve.n_requested if r < curve.n_requested[k]), default=0)
    way = dict(ranking=curve.ranking, higher_is_better=bool(curve.higher_is_better))  # as the curve chose
    best = (hi, circuit_at(scores, curve.fractions[k], **way), curve.values[k])
    total, probes = float(mib_weights(scores.layout).sum()), []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        keep = circuit_at(scores, (mid + 0.5) / total, **way)  # int((mid + 0.5) / N * N) = mid
        edges = [(scores.layout.senders[i], scores.layout.receivers[j]) for i, j in keep.nonzero().tolist()]
        value = scale.evaluate_circuit(model, task, edges, **kw) if edges else empty
        faith = (value - empty) / (full - empty)
        probes.append((mid, len(edges), faith))
        if faith >= share:
            hi, best = mid, (mid, keep, value)
        else:
            lo = mid
    return (*best, tuple(probes))


def chosen(run: Any) -> str:
    """How the circuit was chosen, in a sentence."""
    if run.share is None:
        return (f"the top {run.requested} edges by |score| (--size), pruned to those on a path from the embedding "
                "to the logits")
    how = f"; the curve's points refined by bisection ({len(run.bisection)} more circuits)" if run.bisection else ""
    return (f"the smallest circuit on the faithfulness curve that recovers {run.share:.0%} of the metric (faithfulness "
            f">= {run.share:g}): the top {run.requested} edges by |score|, pruned{how}")


def on_the_curve(curve: Any, scores: Any, kept: Any, n: int) -> float | None:
    """The curve's value of the circuit ``kept`` (a mask), if the curve ran it: its circuit at a fraction
    whose budget is ``n`` edges, chosen as the curve chooses (:func:`rs_interp.circuits.selection.circuit_at`,
    pruned), is the same mask, so the same run (the same ablated writes, the same edges cut) gave that
    value; else None. Saves the circuit's pass and its reference's record (the default size, 0.01, is MIB's)."""
    import torch

    from ..circuits.selection import circuit_at, prune

    for f, requested, value in zip(curve.fractions, curve.n_requested, curve.values):
        way = dict(ranking=curve.ranking, higher_is_better=bool(curve.higher_is_better))
        picked = circuit_at(scores, f, pruned=False, **way)
        if requested == n and torch.equal(prune(scores.layout, picked), kept):
            return value
    return None
