"""Relevance patching (RelP; Jafari, Eberle, Khakzar & Nanda 2025, arXiv 2508.21258): attribution patching with
the local gradients replaced by layer-wise relevance propagation (LRP) coefficients.

**The estimate.** As in edge attribution patching, ``RelP(s -> r) = sum over batch and positions of w_s . R_r``,
``w_s`` the change of sender ``s``'s write (ablated minus run: the reference's under ``"resample"``), ``R_r``
receiver ``r``'s *relevance coefficient*: the gradient of the metric through a backward pass whose local rules
are LRP's, those of the reference implementation (``FarnoushRJ/RelP``, a TransformerLens with ``use_lrp``):

- **LN-rule**: every norm's scale held at its value on the run (a LayerNorm's centring, linear, kept): each
  block's norms, the final norm and the norms after the sublayers of post-norm blocks;
- **AH-rule**: every attention pattern held at its value on the run: relevance reaches a head's values
  alone, none its queries and keys, so an edge into a query or key input is exactly 0 (``qk_fix=True``
  gives those edges the exact change of the pattern instead: AtP*'s QK fix, :mod:`rs_interp.circuits.atp_star`,
  against RelP's coefficient at ``z``);
- **identity rule**: an MLP's activation passes relevance in proportion, ``act(h) / h`` in place of
  ``act'(h)`` (0 where ``h = 0``; for ReLU that is its derivative);
- **half rule**: a gated MLP's product ``act(x W_gate) * (x W_in)`` passes half its gradient to each factor.

The metric's gradient at the logits and a logit soft-cap's derivative are the real ones. On a post-norm
block a head's write is the frozen one, ``gain * c(d W_O) / s`` (:func:`rs_interp.exact.postnorm.frozen_changes`).

**Conservation** (the identity the rules give). Held at the run, the coefficients (patterns, scales, ratios)
make every layer a linear map of its input, and on a model whose biases are all zero (attention, MLP, norms,
unembedding) that map gives the run's own output (the half rule: a product of two factors is homogeneous of
degree 2, and half its gradient dotted with the input is the product). So relevance is conserved: for every
layer ``l``, ``resid_pre_l . R(resid_pre_l) = g . logits``, ``g`` the metric's gradient at the logits before
any soft-cap. With ``ablation="zero"`` (``w_s = -write_s``) that reads, in the edge graph: **the edges crossing
any layer boundary (from a sender before layer l into a receiver at l or after, the logits included) sum to
``-g . logits``**, the embedding's edges too (tested on bias-free copies of LN, LNPre, RMS, RMSPre and
norm-free models, gated, grouped-query and parallel blocks, post-norm families; nonzero biases take a share).

**Where it is attribution patching.** With no norms, ReLU MLPs and patterns that do not depend on the input
(``W_Q = W_K = 0``) every rule is the gradient, and RelP equals :func:`rs_interp.edge_attribution_patching`
(tested to 1e-12 in float64).

**Cost.** A no-grad forward pass on the run and on the reference, the metric's gradient at the logits, and
one backward sweep by hand through the held layers (no autograd graph of the model): about EAP's.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
>>> relp = edge_relevance_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b)
>>> relp.layout.n_edges, relp.edge("L0H0", "L1H0.k")    # the AH-rule: nothing reaches a key
(29, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model, kv_groups
from .._budget import MEMORY_BUDGET
from ..exact.certificate import Certificate, require
from ..exact.needs import QK_FIX, RELEVANCE, needs
from ..exact.readout import compute_dtype
from ..exact.stream import RESID0, ablation_values, start_points
from ..exact.validate import Ablation, check_ablation
from ..labels import LOGITS, head_label, kv_label, mlp_label, receiver_label
from ..metrics import Metric
from ._ablated_run import ablated_writes
from ._lrp import recorded_gradient, run_points, sweep
from ._substrate import contract, outside_inference_mode, record, sender_points, writes
from .atp_star import edge_qk_fix, node_qk_deltas
from .correction import quadrature
from .graph import EdgeEffects, EdgeLayout, edge_layout
from .positions import Positional, PositionSchema, resolve_spans
from .uncertainty import Spread

__all__ = ["EdgeRelevancePatching", "RelevancePatching", "edge_relevance_patching", "relevance_patching"]

#: A node: a head's output ``z``, or its query, key or value.
NODES = ("z", "q", "k", "v")


@dataclass(frozen=True)
class EdgeRelevancePatching(EdgeEffects, Spread, Positional):
    """Relevance patching of every edge (:class:`rs_interp.EdgeEffects`: ``layout``, ``effect`` (sender,
    receiver), NaN where there is no edge, ``clean``).

    Attributes:
        ablation: what an ablated sender writes (:data:`rs_interp.Ablation`).
        qk_fix: edges into queries and keys by the QK fix (else exactly 0: the AH-rule).
        per_example: (batch, sender, receiver) each pair's share, with ``per_example=True``; else None.
        per_span: (sender, receiver, span) each span's share, with ``spans=``; else None (:meth:`positional`).
        schema: the :class:`rs_interp.circuits.positions.PositionSchema` of ``per_span``.

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-1l")
        >>> a, b = ri.induction_batch(3, seed=0).tokens, ri.induction_batch(3, seed=1).tokens
        >>> r = ri.edge_relevance_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b, spans="each")
        >>> bool(torch.allclose(r.per_span.nansum(-1), r.effect.nan_to_num(0), atol=1e-6))
        True
    """

    ablation: str = "resample"
    qk_fix: bool = False
    per_example: Float[torch.Tensor, "batch sender receiver"] | None = None
    per_span: Float[torch.Tensor, "sender receiver span"] | None = None
    schema: PositionSchema | None = None

    #: :func:`rs_interp.fix_unreliable`'s screen for these scores: they have no second-order term, their flat edges
    #: are flagged.
    default_screen: ClassVar[str] = "flat"


@dataclass(frozen=True)
class RelevancePatching(Spread):
    """Relevance patching of every head's node (:func:`relevance_patching`).

    Attributes:
        effect: (layer, head) ``sum (x_ablated - x) . R(x)`` for each head's ``which`` (``z``, ``q``, ``k``, ``v``;
            (layer, kv_head) for keys and values under grouped-query attention); 0 for queries and keys
            unless ``qk_fix``.
        effect_per_position: (layer, head, pos) before the sum over positions (None under the QK fix).
        clean: the metric of the run.
        labels: ``"L{l}H{h}"`` (``"L{l}KV{g}"``) row-major.
        which, ablation, qk_fix: the options.
        per_example: (batch, layer, head) each pair's share, with ``per_example=True``.

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
        >>> node = ri.relevance_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b)
        >>> edges = ri.edge_relevance_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b)
        >>> totals = dict(zip(edges.layout.senders, edges.sender_totals().tolist()))
        >>> abs(float(node.effect[0, 1]) - totals["L0H1"]) < 1e-6
        True
    """

    effect: Float[torch.Tensor, "layer head"]
    effect_per_position: Float[torch.Tensor, "layer head pos"] | None
    clean: float
    labels: tuple[str, ...]
    which: str = "z"
    ablation: str = "resample"
    qk_fix: bool = False
    per_example: Float[torch.Tensor, "batch layer head"] | None = None

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads with the largest ``|effect|``, with their effect."""
        from ..metrics import top_effects

        return top_effects(self.labels, self.effect, k)


def _check_options(qk_fix: object, per_example: object, schema: PositionSchema | None,
                   ig_steps: int | None = None) -> None:
    for name, value in (("qk_fix", qk_fix), ("per_example", per_example)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if qk_fix and ig_steps is not None:
        raise ValueError("the QK fix corrects the estimate at the run itself: it does not combine with ig_steps")
    if qk_fix and schema is not None:
        raise ValueError("qk_fix recomputes a head's pattern with every position of a query or key input moved at "
                         "once; per span it is not built: use positions without qk_fix (queries and keys are then 0, "
                         "the AH-rule)")


def _reader_labels(model: Model, layer: int, kind: str) -> list[str]:
    cfg = model.cfg
    if kind == "logits":
        return [LOGITS]
    if kind == "mlp":
        return [mlp_label(layer)]
    grouped = kv_groups(cfg) != cfg.n_heads
    return [receiver_label(layer, h, "v", kv=grouped) for h in range(kv_groups(cfg) if grouped else cfg.n_heads)]


@needs(*RELEVANCE, optional={"readers": "qk_fix=True", "projections": "qk_fix=True", "head inputs": "qk_fix=True"},
       adapts=QK_FIX)
@outside_inference_mode
def edge_relevance_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: Ablation = "resample",
    qk_fix: bool = False,
    ig_steps: int | None = None,
    ig_rule: str = "gauss",
    spans: str | PositionSchema | None = None,
    per_example: bool = False,
    memory_budget: int = MEMORY_BUDGET,
    progress: bool = True,
) -> EdgeRelevancePatching:
    """Relevance patching of every edge of the model's graph (module docstring):

        effect[s, r] = sum over batch and positions of w_s . R_r

    ``w_s`` the change of sender ``s``'s write when ablated (the reference's write minus the run's under
    ``"resample"``), ``R_r`` receiver ``r``'s relevance coefficient (LRP's rules). Edges into queries and keys
    are 0 (the attention pattern is held) unless ``qk_fix``.

    Args:
        model: a TransformerLens model that :func:`rs_interp.certify` passes for this helper.
        tokens: (batch, pos) the run's tokens.
        metric: a :data:`rs_interp.Metric`, differentiable in the logits.
        reference: the reference run's tokens (``"resample"``: the shape of ``tokens``).
        ablation: what an ablated sender writes (:data:`rs_interp.Ablation`); ``"zero"``: relevance itself,
            ``-write_s . R_r`` (the conservation identity's form).
        qk_fix: edges into queries and keys by the QK fix (:mod:`rs_interp.circuits.atp_star`), RelP's
            coefficient at ``z`` for the gradient after the softmax.
        ig_steps, ig_rule: integrated relevance (EAP-IG's line with RelP's rules): the coefficients averaged over
            ``ig_steps`` runs whose stream entering block 0 is ``x_ref + alpha (x - x_ref)``, at ``ig_rule``'s points
            (``"gauss"``, the default: Gauss-Legendre; ``"left"``, ``"right"``: :func:`rs_interp.attribution_patching`);
            default: at the run alone.
        spans: ``"each"`` or a :class:`rs_interp.circuits.positions.PositionSchema`: also each span's share,
            ``per_span`` (its ``positional()``), summing to ``effect``.
        per_example: keep each pair's share (error bars: :class:`rs_interp.circuits.uncertainty.Spread`).
        memory_budget: bytes one chunk of the QK fix's patched patterns may use (roughly).
        progress: a progress bar (the QK fix's layers).

    Returns:
        An :class:`EdgeRelevancePatching`.

    Raises:
        ValueError: bad tokens, reference or options (named); a model whose identities fail (:func:`rs_interp.certify`).

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
        >>> m = lambda lg: lg[:, -1, 0].mean()
        >>> fixed = edge_relevance_patching(model, a, m, reference=b, qk_fix=True)
        >>> fixed.edge("L0H0", "L1H0.k") != 0.0, fixed.layout.n_edges
        (True, 29)
    """
    tokens, reference = check_ablation(model, tokens, ablation, reference, "edge_relevance_patching")
    schema = resolve_spans(spans, tokens)
    _check_options(qk_fix, per_example, schema, ig_steps)
    alphas, weights, _ = quadrature(ig_steps, ig_rule if ig_steps is not None else "left", None)
    cert = require(model, "edge_relevance_patching", also=("readers", "projections", "head inputs") if qk_fix else ())
    layout = edge_layout(model)
    dt = compute_dtype(model)
    points = sender_points(model)
    box, value, g = recorded_gradient(model, tokens, metric, run_points(model) | {RESID0} | {
        N.mlp_out(l) for l in range(model.cfg.n_layers) if not model.cfg.attn_only})
    run = {k: v for k, v in box.items() if points(k)}
    if ablation == "zero":
        ablated = {k: torch.zeros_like(v) for k, v in run.items()}
    else:
        ablated = ablated_writes(model, tokens, reference, ablation)
    W = writes(model, ablated, run, dtype=torch.float64 if qk_fix else dt, frozen_norms=True)
    terms = _EdgeRelevance(model, W, layout, schema, tokens.shape[0], per_example)
    x_ref = ablated[RESID0].expand_as(box[RESID0])
    for alpha, terms.weight in zip(alphas, weights):  # the run itself (alpha 1), or the integrated-gradients points
        if alpha == 1.0:
            at, grad = box, g
        else:
            at, _, grad = recorded_gradient(model, tokens, metric, run_points(model), line=(alpha, x_ref))
        sweep(model, at, grad, dt, terms.emit)
    if qk_fix:
        seen = record(model, tokens, start_points(model, attention=True))
        fixed = edge_qk_fix(model, layout, tokens, W, [terms.grads_z], seen, cert,
                            per_example, memory_budget, progress)[0]
        terms.shares[..., 0] = torch.where(fixed.isnan(), terms.shares[..., 0], fixed)
    effect, per_pair, per_span = _edge_sums(terms.shares, layout, schema, per_example)
    return EdgeRelevancePatching(layout=layout, effect=effect, clean=value, ablation=ablation, qk_fix=qk_fix,
                                 per_example=per_pair, per_span=per_span, schema=schema)


class _EdgeRelevance:
    """The shares of every edge, filled as :func:`rs_interp.circuits._lrp.sweep` emits each reader's coefficients
    (``emit``), at the point's ``weight``; ``dm/dz`` per layer kept for the QK fix (``grads_z``)."""

    def __init__(self, model: Model, W: torch.Tensor, layout: EdgeLayout, schema: PositionSchema | None, batch: int,
                 per_example: bool) -> None:
        self.model, self.W, self.per_example = model, W, per_example
        self.spans = None if schema is None else schema.one_hot().to(W.device)
        self.shares = torch.zeros(batch if per_example else 1, len(layout.senders), len(layout.receivers),
                                  1 if schema is None else schema.n_spans, dtype=torch.float64)
        self.column = {r: j for j, r in enumerate(layout.receivers)}
        self.upstream = layout.exists.sum(0).tolist()
        self.grads_z: dict[int, torch.Tensor] = {}
        self.weight = 1.0  # the point's weight on the line (set by the loop over the points)

    def emit(self, layer: int, kind: str, t: torch.Tensor) -> None:
        """A reader's coefficients contracted with its senders' writes (a head's ``z`` kept for the QK fix)."""
        if kind == "z":
            self.grads_z[layer] = t.to(torch.float64)
        if kind not in ("logits", "mlp", "v"):
            return
        cols = [self.column[r] for r in _reader_labels(self.model, layer, kind)]
        k = self.upstream[cols[0]]
        part = contract(self.W[:k], t.to(self.W.dtype), per_example=self.per_example, spans=self.spans)
        self.shares[:, :k, cols] += self.weight * part


def _edge_sums(shares: torch.Tensor, layout: EdgeLayout, schema: PositionSchema | None,
               per_example: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The estimate, each pair's share and each span's share from the shares (batch or 1, sender, receiver, span);
    NaN where there is no edge."""
    gone = ~layout.exists
    effect = shares.sum((0, 3))
    effect[gone] = float("nan")
    per_span = None
    if schema is not None:
        per_span = shares.sum(0)
        per_span[gone] = float("nan")
    per_pair = None
    if per_example:
        per_pair = shares.sum(3)
        per_pair[:, gone] = float("nan")
    return effect, per_pair, per_span


@needs(*RELEVANCE, optional={"readers": "qk_fix=True", "projections": "qk_fix=True"}, adapts=QK_FIX)
@outside_inference_mode
def relevance_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: Ablation = "resample",
    which: str = "z",
    qk_fix: bool = False,
    per_example: bool = False,
    progress: bool = True,
) -> RelevancePatching:
    """Relevance patching of every head's ``z`` (or its ``which``: ``"q"``, ``"k"``, ``"v"``):
    ``sum over batch and positions of (x_ablated - x) . R(x)``, ``R(x)`` the relevance coefficient at the node
    (module docstring). A head's ``z`` node equals the sum of its outgoing edges (:func:`edge_relevance_patching`);
    queries and keys are 0 (the AH-rule) unless ``qk_fix`` (the pattern recomputed with the ablated query or key,
    against RelP's coefficient at ``z``).

    Args:
        reference, ablation: as in :func:`edge_relevance_patching`.
        which: the node: ``"z"``, ``"q"``, ``"k"`` or ``"v"`` (per KV head for keys and values under grouped-query
            attention).
        qk_fix: for ``which="q"`` or ``"k"``.
        per_example: keep each pair's share.
        progress: a progress bar (the QK fix's layers).

    Raises:
        ValueError: bad tokens, reference or options; the QK fix on ``z`` or ``v``; a model whose identities fail.

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
        >>> keys = relevance_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b, which="k")
        >>> keys.effect.abs().max().item()
        0.0
    """
    tokens, reference = check_ablation(model, tokens, ablation, reference, "relevance_patching")
    if which not in NODES:
        raise ValueError(f"which must be one of {NODES}, got {which!r}")
    _check_options(qk_fix, per_example, None)
    if qk_fix and which not in ("q", "k"):
        raise ValueError(f"the QK fix recomputes the pattern after a query or key patch: which='q' or 'k', "
                         f"not {which!r}")
    cert = require(model, "relevance_patching", also=("readers", "projections") if qk_fix else ())
    cfg = model.cfg
    L, B, P = cfg.n_layers, tokens.shape[0], tokens.shape[1]
    n = kv_groups(cfg) if which in ("k", "v") else cfg.n_heads
    point = N.z if which == "z" else (lambda l: N.projection(l, which))
    nodes = {point(l) for l in range(L)}
    box, value, g = recorded_gradient(model, tokens, metric, run_points(model) | nodes)
    shares = torch.zeros(B, L, n, P, dtype=torch.float64)
    ablated = lambda: _ablated_nodes(model, reference, ablation, box, nodes)  # noqa: E731
    if which in ("z", "v"):
        _linear_nodes(model, point, "z" if which == "z" else "dv", box, g, ablated(), shares)
    elif qk_fix:
        for l, part in enumerate(_qk_parts(model, tokens, which, box, g, ablated, cert, progress)):
            shares[:, l, :, 0] = part
    labels = tuple((kv_label if n != cfg.n_heads else head_label)(l, h) for l in range(L) for h in range(n))
    per_position = None if qk_fix else shares.sum(0)
    pairs = shares.sum(-1)
    return RelevancePatching(effect=pairs.sum(0), effect_per_position=per_position, clean=value, labels=labels,
                             which=which, ablation=ablation, qk_fix=qk_fix, per_example=pairs if per_example else None)


def _ablated_nodes(model: Model, reference: torch.Tensor | None, ablation: Ablation, box: dict,
                   nodes: set[str]) -> dict[str, torch.Tensor]:
    """What each node reads when ablated (zeros, or :func:`rs_interp.exact.stream.ablation_values`)."""
    if ablation == "zero":
        return {name: torch.zeros_like(box[name]) for name in nodes}
    return ablation_values(model, reference, ablation, lambda name: name in nodes)


def _linear_nodes(model: Model, point: Callable[[int], str], kind: str, box: dict, g: torch.Tensor,
                  ablated: dict[str, torch.Tensor], shares: torch.Tensor) -> None:
    """Each head's ``z`` or ``v`` node (``point``; ``kind`` its coefficient's, ``"z"`` or ``"dv"``):
    ``(x_ablated - x) . R(x)`` per position, into ``shares``."""

    def emit(layer: int, k: str, t: torch.Tensor) -> None:
        if k == kind:
            delta = (ablated[point(layer)] - box[point(layer)]).to(torch.float64)
            shares[:, layer] = torch.einsum("bpnd,bpnd->bnp", delta, t.to(torch.float64))

    sweep(model, box, g, compute_dtype(model), emit)


def _qk_parts(model: Model, tokens: torch.Tensor, which: str, box: dict, g: torch.Tensor,
              ablated: Callable[[], dict[str, torch.Tensor]], cert: Certificate, progress: bool) -> list[torch.Tensor]:
    """Per layer, (batch, head or kv_head): each query or key node by the QK fix, the pattern recomputed with the
    ablated query or key against RelP's coefficient at ``z``."""
    grads_z: dict[int, torch.Tensor] = {}

    def keep(layer: int, k: str, t: torch.Tensor) -> None:
        if k == "z":
            grads_z[layer] = t.to(torch.float64)

    sweep(model, box, g, compute_dtype(model), keep)
    ref = {k: v.expand_as(box[k]) for k, v in ablated().items()}
    moved = node_qk_deltas(model, tokens, ref, record(model, tokens, start_points(model)), cert, which, progress)
    cfg = model.cfg
    n = kv_groups(cfg) if which in ("k", "v") else cfg.n_heads
    B = tokens.shape[0]
    return [torch.einsum("bphd,bphd->bh", moved[l], grads_z[l]).reshape(B, n, cfg.n_heads // n).sum(-1)
            for l in range(cfg.n_layers)]
