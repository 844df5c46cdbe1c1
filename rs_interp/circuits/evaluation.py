"""Circuits (sets of edges of the model's graph) and how faithful they are.

A circuit keeps its edges and ablates every other one: receiver ``r``'s input becomes

    input_r + sum over senders s upstream of r with (s, r) outside the circuit of (ablated_s - write_s)

where ``write_s`` is the sender's write in this very run (upstream ablations propagate) and
``ablated_s`` what it writes ablated (:data:`rs_interp.Ablation`): its write in the reference run,
pair by pair (``"resample"``, MIB's "patching"), its mean over the reference batch at each position
(``"position_mean"``, MIB's "mean-positional"), over the batch and positions (``"mean"``) or nothing
(``"zero"``). One forward pass per circuit, exact: the circuit of every edge is the clean run, the
empty circuit with resampling the reference run (tested to 1e-9).

Faithfulness (the MIB benchmark's circuit track, Mueller et al. 2025) of a circuit ``C`` is
``(m(C) - m(empty)) / (m(clean) - m(empty))``. :func:`faithfulness_curve` evaluates the circuits MIB
evaluates (:func:`rs_interp.circuits.selection.circuit_at`: ``int(f * N)`` edges at each fraction
``f``, dangling edges pruned) and the areas of the curve over ``f`` by the trapezoid rule: MIB's CPR is
the area under the curve of the edges ranked by signed score, its CMD the area between 1 and the
curve of the edges ranked by absolute score.

>>> from rs_interp import load_toy_model, induction_batch, next_token_loss, edge_attribution_patching
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(8, seed=0), induction_batch(8, seed=1)
>>> metric = next_token_loss(a.targets)
>>> eap = edge_attribution_patching(model, a.tokens, metric, reference=b.tokens)
>>> curve = faithfulness_curve(model, a.tokens, metric, eap, reference=b.tokens)
>>> len(curve.fractions), round(curve.faithfulness[-1], 6)
(10, 1.0)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch
from jaxtyping import Int

from .._backend import Model
from .._keywords import renamed
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import EVALUATED, needs
from ..exact.stream import mlp_flags
from ..exact.validate import Ablation, check_ablation
from ..metrics import Metric
from . import positions as pos
from ._ablated_run import ablated_writes, run_circuit
from ._curves import CurveOptions, run_circuits
from .graph import EdgeEffects, EdgeLayout, Embedding, edge_layout, embedding_of
from .selection import Ranking, check_fractions, mask, mib_weights, prune

__all__ = ["MIB_FRACTIONS", "FaithfulnessCurve", "MIBScores", "evaluate_circuit", "faithfulness_curve", "mib_scores"]

#: The circuit sizes of the MIB circuit track: fractions of the model's edges kept.
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _reaches_logits(layout: EdgeLayout, keep: torch.Tensor) -> bool:
    return bool(prune(layout, keep).any())


@needs(*EVALUATED, optional={"embedding": "embedding='token' or 'split'"})
@renamed(method="ablation")
def evaluate_circuit(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    circuit: Iterable[tuple[str, str]],
    *,
    reference: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: Ablation = "resample",
    embedding: Embedding = "sum",
    spans: str | pos.PositionSchema | None = None,
) -> float:
    """``metric`` of the run with every edge outside ``circuit`` ablated (module docstring).

    Args:
        circuit: ``(sender, receiver)`` edges to keep, labelled as :func:`rs_interp.edge_layout` does (with ``spans``,
            ``(sender, receiver, span)``: one outside is ablated at its span's positions only).
        reference: tokens of the reference run: the shape of ``tokens`` for ``"resample"``, as long
            as ``tokens`` for ``"position_mean"``, any shape for ``"mean"``; unused by ``"zero"``.
        ablation: what an ablated edge carries (:data:`rs_interp.Ablation`, module docstring); below,
            which of EAP-IG's ``evaluate_graph`` interventions each equals (hannamw/EAP-IG at 7af394a, the
            commit MIB's circuit track pins).
        embedding: the graph's input senders (:func:`rs_interp.edge_layout`): ``"sum"`` (``embed``),
            ``"token"`` (``tok_embed``, EAP-IG's input node ``hook_embed``: the position embedding is
            never ablated) or ``"split"`` (``tok_embed`` and ``pos_embed``).
        spans: ``"each"`` or a :class:`rs_interp.circuits.positions.PositionSchema` of ``tokens``: the circuit's spans.

    Which reference quantity each ablation equals (a sender ``s``'s ablated write; ``reference`` the prompts
    EAP-IG's ``intervention_dataloader`` or corrupted prompts hold):

    - ``"resample"``: ``s``'s write in the run on ``reference``, pair by pair: EAP-IG's ``"patching"``
      (MIB's), on any ``embedding`` (a pair's two runs add the same position embedding).
    - ``"zero"``: 0: EAP-IG's ``"zero"`` with ``embedding="token"`` only; with ``"sum"`` the position
      embedding is zeroed too, another number.
    - ``"position_mean"``: ``s``'s mean over the ``reference`` batch at each position: EAP-IG's
      ``"mean-positional"`` (MIB's) when its prompts are all of one length (its mean counts padded
      positions), on any ``embedding`` (the position embedding's mean over a batch is itself).
    - ``"mean"``: ``s``'s mean over the ``reference`` batch and every position. No EAP-IG intervention
      is this: its ``"mean"`` (``compute_mean_activations(per_position=False)``) writes one vector for
      every sender, the mean over all its graph's senders (the input, each head, each MLP) of each
      prompt's write at its last position divided by the prompt's length, averaged over the prompts
      (issue 61 measured a circuit's metric 0.24 under it against 0.65 under rs_interp's "mean").

    Warns:
        UserWarning: the circuit has no path from the embedding to the logits (its dangling edges,
            which MIB prunes, carry nothing that reaches the output).

    Raises:
        ValueError: a malformed entry, an unknown label or a pair that is not an edge (named); bad
            tokens, reference or ablation; a model whose identities do not hold (:func:`rs_interp.certify`).

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> every = rs_interp.edge_layout(model).edges()
        >>> abs(evaluate_circuit(model, a, metric, every, reference=b) - float(metric(model(a)).detach())) < 1e-5
        True
    """
    tokens, reference = check_ablation(model, tokens, ablation, reference, "evaluate_circuit")
    layout = edge_layout(model, embedding)
    schema = pos.resolve_spans(spans, tokens)
    keep = mask(layout, circuit) if schema is None else pos.positional_mask(layout, schema.names, circuit)
    require(model, "evaluate_circuit", also=("embedding",) if embedding != "sum" else ())
    reaches = _reaches_logits(layout, keep) if schema is None else bool(pos.positional_prune(layout, keep).any())
    if keep.any() and not reaches:  # stacklevel 3: the caller's line, past the renamed() wrapper
        warnings.warn("this circuit has no path from the embedding to the logits: every path through it is cut, so it "
                      "computes what the empty circuit does (MIB prunes such dangling edges: faithfulness_curve)",
                      stacklevel=3)
    with preserve_state(model, **mlp_flags(model)), torch.no_grad():
        return run_circuit(model, tokens, metric, layout, keep,
                           ablated_writes(model, tokens, reference, ablation, embedding), "circuit run",
                           masks=None if schema is None else pos.span_masks(schema))


@dataclass(frozen=True)
class FaithfulnessCurve:
    """Faithfulness of the circuits MIB evaluates at several sizes (:func:`faithfulness_curve`).

    Attributes:
        fractions: the fractions ``f`` of the graph's edges (MIB's count).
        ranking: how the edges were ranked, ``"absolute"`` or ``"signed"``.
        n_requested: ``int(f * N)`` per fraction, ``N`` the graph's edges as MIB counts them.
        n_edges: the edges each circuit kept, after pruning (MIB's count: the real size).
        values: the metric of each circuit.
        faithfulness: ``(values - empty) / (clean - empty)``.
        clean: the run's own metric (every edge kept).
        empty: the metric with no edge kept (every edge ablated).
        area_under: the area under the curve over ``fractions`` (trapezoid rule): MIB's CPR for the
            signed ranking.
        area_from_1: the area between 1 and the curve, ``|1 - faithfulness|``: MIB's CMD for the
            absolute ranking.
        mib_counts: the sizes MIB's ``evaluate_area_under_curve`` reports (its ``weighted_edge_counts``)
            for these circuits: the top edges after one pass of pruning, as the EAP-IG commit MIB pins
            counts them before its evaluation prunes to the end
            (:func:`rs_interp.circuits.selection.prune`), in MIB's edges, as floats. ``n_edges`` is
            the size of the circuit evaluated; the two differ where that one pass leaves dangling edges.
        higher_is_better: the metric's direction the signed ranking used (:func:`rs_interp.metrics.direction`:
            the argument, else the metric's own, else whether ``clean`` is above ``empty``).
        direction_from: where it came from: ``"argument"``, ``"metric"`` or ``"clean and empty"``.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)
        >>> curve = rs_interp.faithfulness_curve(model, a, metric, eap, reference=b, fractions=(0.1, 0.5, 1.0))
        >>> len(curve.values) == len(curve.faithfulness) == len(curve.fractions) == 3, curve.n_requested
        (True, (2, 14, 29))
    """

    fractions: tuple[float, ...]
    ranking: str
    n_requested: tuple[int, ...]
    n_edges: tuple[int, ...]
    values: tuple[float, ...]
    faithfulness: tuple[float, ...]
    clean: float
    empty: float
    area_under: float
    area_from_1: float
    mib_counts: tuple[float, ...] | None = None
    higher_is_better: bool | None = None
    direction_from: str | None = None

    @property
    def cpr(self) -> float:
        """MIB's CPR: the area under the curve of the edges ranked by signed score.

        Raises:
            ValueError: the curve ranks by absolute score (MIB's CPR ranks by signed score).
        """
        return self._ranked("signed", self.area_under, "CPR is the area under the curve",
                            "area_under is ranked by |score|")

    @property
    def cmd(self) -> float:
        """MIB's CMD: the area between 1 and the curve of the edges ranked by absolute score.

        Raises:
            ValueError: the curve ranks by signed score (MIB's CMD ranks by absolute score).
        """
        return self._ranked("absolute", self.area_from_1, "CMD is the area between 1 and the curve",
                            "area_from_1 is ranked by signed score")

    def _ranked(self, ranking: str, area: float, what: str, instead: str) -> float:
        """``area`` where the curve ranks the edges by ``ranking`` (MIB's), else a ValueError that says so."""
        if self.ranking != ranking:
            raise ValueError(f"{what} of the edges ranked by {ranking} score (MIB): faithfulness_curve(..., "
                             f"ranking='{ranking}'); this curve's {instead}")
        return area


def _area(x: Sequence[float], y: Sequence[float]) -> float:
    return float(sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1)))


@needs(*EVALUATED, optional={"embedding": "scores on embedding='token' or 'split'"})
@renamed(method="ablation")
def faithfulness_curve(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    scores: EdgeEffects,
    *,
    reference: Int[torch.Tensor, "batch pos"] | None = None,
    fractions: Sequence[float] = MIB_FRACTIONS,
    ranking: Ranking = "absolute",
    ablation: Ablation = "resample",
    pruned: bool = True,
    higher_is_better: bool | None = None,
    progress: bool = True,
) -> FaithfulnessCurve:
    """The faithfulness of the circuits MIB evaluates from ``scores`` at each fraction (MIB's ten by
    default), over the pairs ``tokens`` / ``reference`` (row by row), with the curve's areas
    (module docstring). CPR: ``ranking="signed"``, ``.cpr``; CMD: ``ranking="absolute"``, ``.cmd``.

    Args:
        scores: edge scores of this model's graph (any :class:`rs_interp.circuits.EdgeEffects`), on any of its
            input senders (:func:`rs_interp.edge_layout`'s ``embedding``: the curve ablates those).
        reference, ablation: as in :func:`evaluate_circuit`.
        fractions: increasing, in (0, 1].
        ranking: ``"absolute"`` (by ``|score|``) or ``"signed"`` (by score, largest first).
        pruned: prune dangling edges as MIB does (``False``: every chosen edge stays, rs_interp's
            earlier rule; a circuit may then hold edges that reach nothing).
        higher_is_better: the metric's direction, for ``ranking="signed"``: MIB ranks the scores of
            the loss, largest first (:func:`rs_interp.circuits.mib_importances`), so with a logit or
            probability difference (``True``) the smallest effects come first, with a loss (``False``)
            the largest. ``None`` (the default): the one rule, :func:`rs_interp.metrics.direction`, the
            metric's own declaration (a task's metric: ``True``; :func:`rs_interp.next_token_loss`:
            ``False``), else ``True`` when the clean run's metric is above the empty circuit's; the result
            says which (``higher_is_better``, ``direction_from``). The absolute ranking is the same either way.
        progress: a progress bar over the circuits.

    Raises:
        ValueError: ``scores`` from another model's layout, bad fractions or ranking, the clean and
            empty circuits giving the same metric (faithfulness undefined).

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)
        >>> curve = faithfulness_curve(model, a, metric, eap, reference=b, fractions=(0.5, 1.0))
        >>> curve.n_requested, round(curve.faithfulness[-1], 6)
        ((14, 29), 1.0)
    """
    tokens, reference = check_ablation(model, tokens, ablation, reference, "faithfulness_curve")
    fr = check_fractions(fractions)
    if not isinstance(scores, (EdgeEffects, pos.PositionalEdgeEffects)):
        raise ValueError("scores must be edge scores (EdgeEffects, or pos.PositionalEdgeEffects) of this model's edge "
                         "layout")
    embedding = embedding_of(scores.layout)
    require(model, "faithfulness_curve", also=("embedding",) if embedding != "sum" else ())
    options = CurveOptions(reference, fr, ablation, pruned, higher_is_better, progress)
    return _curves(model, tokens, metric, [(scores, ranking)], options)[0]


def _curves(model: Model, tokens: torch.Tensor, metric: Metric, requests: Sequence[tuple[EdgeEffects, Ranking]],
            options: CurveOptions) -> list[FaithfulnessCurve]:
    """One :class:`FaithfulnessCurve` per ``(scores, ranking)`` of ``requests`` (checked arguments), sharing
    what they can: the ablated writes, the clean and the empty run are computed once, and each distinct
    circuit (by its kept edges) is run once, however many curves hold it (MIB's smallest sizes round to
    the empty circuit, the largest to the full graph, and methods that agree pick the same edges): the
    same forward pass gives the same number, so sharing changes nothing but the count of passes. Every
    request's scores are on the same input senders (:func:`rs_interp.edge_layout`'s ``embedding``), and all edge
    scores or all positional (:class:`rs_interp.circuits.positions.PositionalEdgeEffects`, with their spans).
    The metric's direction (the signed ranking's) is settled by :func:`rs_interp.metrics.direction` from
    the clean and the empty run before any circuit is chosen."""
    run = run_circuits(model, tokens, metric, requests, options)
    fractions, weights, clean, empty = options.fractions, run.weights, run.clean, run.empty
    total = float(weights.sum())
    out = []
    for (_scores, ranking), curve, picked, values in zip(requests, run.circuits, run.chosen, run.values):
        faith = [(v - empty) / (clean - empty) for v in values]
        out.append(FaithfulnessCurve(fractions=tuple(fractions), ranking=ranking,
                                     n_requested=tuple(int(f * total) for f in fractions),
                                     n_edges=tuple(int(float((weights * keep).sum())) for keep in curve),
                                     values=tuple(values), faithfulness=tuple(faith), clean=clean, empty=empty,
                                     area_under=_area(fractions, faith),
                                     area_from_1=_area(fractions, [abs(1 - f) for f in faith]),
                                     mib_counts=mib_counts(run.layout, picked),
                                     higher_is_better=run.way.higher_is_better, direction_from=run.way.source))
    return out


def mib_counts(layout: EdgeLayout, chosen: list[torch.Tensor]) -> tuple[float, ...]:
    """What MIB's harness reports as each circuit's size: its edges after one pass of pruning (:func:`prune`;
    on the positional graph :func:`rs_interp.circuits.positions.positional_prune`)."""
    positional = bool(chosen) and chosen[0].ndim == 3
    weights = pos.positional_weights(layout, chosen[0].shape[-1]) if positional else mib_weights(layout)
    pruner = pos.positional_prune if positional else prune
    return tuple(float((weights * pruner(layout, keep, passes=1)).sum()) for keep in chosen)


@dataclass(frozen=True)
class MIBScores:
    """MIB's two circuit scores of one set of edge scores (:func:`mib_scores`).

    Attributes:
        cpr: the area under the faithfulness curve of the edges ranked by signed score.
        cmd: the area between 1 and the curve of the edges ranked by absolute score.
        signed, absolute: the two curves.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-1l")
    >>> a, b = ri.induction_batch(2, seed=0).tokens, ri.induction_batch(2, seed=1).tokens
    >>> metric = lambda logits: logits[:, -1, 0].mean()
    >>> eap = ri.edge_attribution_patching(model, a, metric, reference=b, progress=False)
    >>> mib = ri.mib_scores(model, a, metric, eap, reference=b, progress=False)
    >>> mib.signed.ranking, mib.absolute.ranking, mib.cpr == mib.signed.area_under
    ('signed', 'absolute', True)
    """

    cpr: float
    cmd: float
    signed: FaithfulnessCurve
    absolute: FaithfulnessCurve


@needs(*EVALUATED)
@renamed(method="ablation")
def mib_scores(model: Model, tokens: Int[torch.Tensor, "batch pos"], metric: Metric,
               scores: EdgeEffects | Mapping[str, EdgeEffects], *,
               reference: Int[torch.Tensor, "batch pos"] | None = None, fractions: Sequence[float] = MIB_FRACTIONS,
               ablation: Ablation = "resample", higher_is_better: bool | None = None,
               progress: bool = True) -> MIBScores | dict[str, MIBScores]:
    """CPR and CMD as MIB's circuit track computes them: two :func:`faithfulness_curve` s, the edges
    ranked by signed score (CPR, the area under it) and by absolute score (CMD, the area between it and 1).
    MIB's signed ranking is of the loss's scores, so it depends on the metric's direction: by default
    (``higher_is_better=None``) the one rule of :func:`rs_interp.metrics.direction` (the metric's own
    declaration, else the clean run against the empty circuit), which gives a logit or probability
    difference ``True``, as :func:`rs_interp.circuits.write_mib` writes by default: the CPR is then the one
    MIB's evaluation gives on that file. The curves say which direction was used (``signed.higher_is_better``).

    ``scores`` may be one result or a mapping name -> result (several methods compared): then a dict
    name -> :class:`MIBScores`, every curve computed together, each distinct circuit run once (the
    ablated writes, the clean and the empty run shared): the same numbers as one call per result, in
    fewer passes (``1 + distinct circuits`` rather than ``2 x 12`` per result).

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)
        >>> mib = rs_interp.mib_scores(model, a, metric, eap, reference=b)
        >>> mib.cpr == mib.signed.area_under, mib.cmd == mib.absolute.area_from_1
        (True, True)
        >>> both = rs_interp.mib_scores(model, a, metric, {"EAP": eap, "again": eap}, reference=b)
        >>> both["EAP"].cpr == both["again"].cpr == mib.cpr
        True
    """
    require(model, "mib_scores")
    tokens, reference = check_ablation(model, tokens, ablation, reference, "mib_scores")
    fr = check_fractions(fractions)
    named = dict(scores) if isinstance(scores, Mapping) else {None: scores}
    if not named:
        raise ValueError("scores is an empty mapping: pass at least one result")
    embeddings = {embedding_of(s.layout) for s in named.values()
                  if isinstance(s, (EdgeEffects, pos.PositionalEdgeEffects))}
    if embeddings - {"sum"}:
        require(model, "mib_scores", also=("embedding",))
    requests = [(s, ranking) for s in named.values() for ranking in ("signed", "absolute")]
    options = CurveOptions(reference, fr, ablation, True, higher_is_better, progress)
    curves = _curves(model, tokens, metric, requests, options)
    out = {name: MIBScores(cpr=signed.area_under, cmd=absolute.area_from_1, signed=signed, absolute=absolute)
           for name, signed, absolute in zip(named, curves[0::2], curves[1::2])}
    return out if isinstance(scores, Mapping) else out[None]
