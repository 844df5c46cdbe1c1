"""ACDC (Conmy et al. 2023, "Towards automated circuit discovery"): prune the edge graph one edge at a
time, each removal measured exactly on the graph pruned so far.

Start from every edge of the graph (:func:`rs_interp.edge_layout`), metric ``m(G)`` the clean run's.
Visit the receivers from the logits backward (reverse depth order: a component's outgoing edges are
decided before its incoming ones) and, for each, its incoming edges from the latest sender back; for
edge ``e`` evaluate the graph without it, ``m(G - e)`` (one forward pass: every edge outside the graph
ablated, :func:`rs_interp.evaluate_circuit`), and

    remove e  iff  |m(G - e) - m(G)| <= threshold          (then G := G - e, m(G) := m(G - e))

So at ``threshold = 0`` only an edge whose removal changes the metric by exactly nothing goes (every
edge with an effect stays), at ``threshold = inf`` every edge goes; an edge whose receiver has lost
all its outgoing edges changes nothing any more and goes at any threshold. Each number is exact (no
gradient); the cost is one forward pass per edge, in sequence (each decision reads the graph the earlier
ones left). The score of an edge (``effect``) is ``m(G - e) - m(G)`` when it was tried: what ranks the
edges for an AUROC or a faithfulness curve.

>>> from rs_interp import load_toy_model, induction_batch, next_token_loss
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(8, seed=0), induction_batch(8, seed=1)
>>> run = acdc(model, a.tokens, next_token_loss(a.targets), reference=b.tokens, threshold=0.05)
>>> run.layout.n_edges, 0 < len(run.circuit()) < 29
(29, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int

from .._backend import Model
from .._keywords import renamed, renamed_attribute
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import EVALUATED, needs
from ..exact.stream import mlp_flags
from ..exact.validate import Ablation, check_ablation
from ..metrics import Metric, metric_value
from ._ablated_run import ablated_writes, run_circuit
from .graph import EdgeEffects, edge_layout

__all__ = ["ACDC", "acdc"]


@dataclass(frozen=True)
class ACDC(EdgeEffects):
    """ACDC's run (:func:`acdc`): :class:`rs_interp.EdgeEffects` whose ``effect`` is each edge's
    ``m(G - e) - m(G)`` when tried, and ``clean`` the run's metric.

    Attributes:
        kept: (sender, receiver) the edges ACDC kept.
        threshold: the threshold it pruned at.
        ablation: how removed edges were ablated.
        final: the metric of the kept circuit.

    Example:
        >>> import rs_interp
        >>> model = rs_interp.load_toy_model("induction-1l")
        >>> a, b = rs_interp.induction_batch(2, seed=0).tokens, rs_interp.induction_batch(2, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> run = rs_interp.acdc(model, a, metric, reference=b, threshold=0.0, progress=False)
        >>> isinstance(run, ACDC), len(run.circuit()) == int(run.kept.sum())
        (True, True)
    """

    kept: Bool[torch.Tensor, "sender receiver"] = None  # type: ignore[assignment]
    threshold: float = 0.0
    ablation: str = "resample"
    final: float = float("nan")

    method = renamed_attribute("method", "ablation")

    def circuit(self) -> list[tuple[str, str]]:
        """The kept edges, row-major."""
        return [e for e, k in zip(self.layout.edges(), self.kept[self.layout.exists].tolist()) if k]


@needs(*EVALUATED)
@renamed(method="ablation")
def acdc(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"] | None = None,
    threshold: float,
    ablation: Ablation = "resample",
    progress: bool = True,
) -> ACDC:
    """ACDC on the model's edge graph (module docstring).

    Args:
        metric: a :data:`rs_interp.Metric` (ACDC's paper uses the KL divergence to the clean output;
            any scalar function of the logits will do).
        reference, ablation: what a removed edge carries (:func:`rs_interp.evaluate_circuit`).
        threshold: remove an edge when its removal moves the metric by at most this much (>= 0; ``inf`` allowed).
        progress: a progress bar over the edges (drawn after a couple of seconds of work).

    Raises:
        ValueError: a negative or NaN threshold, bad tokens, reference or ablation, a model whose
            identities fail, a metric that returns no finite number.

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> every = acdc(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b, threshold=0.0)
        >>> none = acdc(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b, threshold=float("inf"))
        >>> len(every.circuit()), len(none.circuit())
        (29, 0)
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold) or threshold < 0:
        raise ValueError(f"threshold must be a number >= 0 (inf allowed), got {threshold!r}")
    tokens, reference = check_ablation(model, tokens, ablation, reference, "acdc")
    layout = edge_layout(model)
    require(model, "acdc")
    keep = layout.exists.clone()
    effect = torch.full(layout.exists.shape, float("nan"), dtype=torch.float64)
    # Receivers from the logits back; each one's senders from the latest back.
    order = [(i, j) for j in reversed(range(len(layout.receivers))) for i in reversed(range(len(layout.senders)))
             if layout.exists[i, j]]
    with preserve_state(model, **mlp_flags(model)), torch.no_grad():
        ablated = ablated_writes(model, tokens, reference, ablation)
        clean = metric_value(metric(model(tokens, return_type="logits")), "clean run")
        current = run_circuit(model, tokens, metric, layout, keep, ablated, "every edge")
        for i, j in bar(order, desc="ACDC", enabled=progress, unit="edge"):
            keep[i, j] = False
            value = run_circuit(model, tokens, metric, layout, keep, ablated, f"without {layout.senders[i]} -> "
                                                                              f"{layout.receivers[j]}")
            effect[i, j] = value - current
            if abs(value - current) <= threshold:
                current = value
            else:
                keep[i, j] = True
    return ACDC(layout=layout, effect=effect, clean=clean, kept=keep, threshold=float(threshold), ablation=ablation,
                final=current)
