"""Edge attribution patching over the model's whole edge graph (:mod:`rs_interp.circuits.graph`).

Patching the *edge* from sender ``s`` into receiver ``r``, i.e. adding the change of the sender's
write ``w_s = write_ref - write`` to that one input only (every other reader keeps the run's), moves a
metric by about

    EAP(s -> r) = sum over batch and positions of w_s . d metric / d input_r

The senders' writes: ``embed``, the stream entering block 0; head ``h``, ``z W_O^h``; an MLP, its
output. The receivers' inputs are read before their LayerNorm: a head's ``hook_{q,k,v}_input`` (per
KV head for keys and values under grouped-query attention), an MLP's ``hook_mlp_in``, and the final
stream for ``logits``. Each estimate is the exact derivative of the metric along the edge's patch
(tested against finite differences to 1e-6 in float64); since every reader of the stream is a
receiver, a sender's outgoing edges sum to the derivative along its whole write (its node estimate).

With ``ig_steps=m`` (EAP-IG, Hanna et al. 2024) the gradients are averaged over ``m`` points on the
line from the reference's input embedding to the run's (see :func:`rs_interp.attribution_patching`;
``ig_rule="gauss"``: the Gauss-Legendre points and weights).

Options (each its own definition and test): ``qk_fix`` and ``grad_drop`` (AtP*,
:mod:`rs_interp.circuits.atp_star`), ``correction="hessian"`` (the second-order term,
:mod:`rs_interp.circuits.correction`; with it ``first_order`` and ``.reliability()``), and
``per_example`` (each pair's share: ``.stderr()``, ``.error_bar()``, :func:`rs_interp.circuits.uncertainty.bootstrap`).

>>> from rs_interp import load_toy_model, induction_batch
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
>>> eap = edge_attribution_patching(model, a, lambda logits: logits[:, -1, 0].mean(), reference=b)
>>> tuple(eap.effect.shape), eap.layout.n_edges, len(eap.top(1)[0][0])   # an edge: (sender, receiver)
((5, 13), 29, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from jaxtyping import Float, Int

from .. import _backend
from .. import _names as N
from .._backend import Model
from .._budget import MEMORY_BUDGET
from .._state import preserve_state
from ..exact.certificate import Certificate, require
from ..exact.needs import EDGE_ESTIMATES, QK_FIX, needs
from ..exact.readout import compute_dtype
from ..exact.stream import RESID0, Reader, mlp_flags, reader_gradients, readers, start_points
from ..hooks import store_matching
from ..metrics import Metric
from ._substrate import IGRule, check_pair, contract, outside_inference_mode, record, sender_points, writes
from .atp_star import check_drop_layers, combine_drops, drop_hooks, edge_qk_fix, z_gradients
from .correction import Passes, clean_metric, run_passes
from .graph import EdgeEffects, EdgeLayout, edge_layout
from .options import EstimateOptions
from .positions import Positional, PositionSchema, resolve_spans
from .uncertainty import Spread

__all__ = ["EdgeAttributionPatching", "edge_attribution_patching"]


@dataclass(frozen=True)
class EdgeAttributionPatching(EdgeEffects, Spread, Positional):
    """Edge-level estimates on the model's edge graph (:class:`rs_interp.EdgeEffects`: ``layout``,
    ``effect`` (sender, receiver), NaN where there is no edge, ``clean``, ``.edge(s, r)``, ``.top(k)``).

    Attributes:
        ig_steps, ig_rule: ``m`` of EAP-IG and its rule, or None for plain edge attribution patching.
        qk_fix, grad_drop: AtP*'s options (:mod:`rs_interp.circuits.atp_star`).
        correction: ``"hessian"`` or None (:mod:`rs_interp.circuits.correction`).
        first_order: with the correction, the estimate without it (the same passes); else None.
        per_example: (batch, sender, receiver) each pair's share (they sum to ``effect``), with
            ``per_example=True``; else None. ``.stderr()``, ``.error_bar()``, ``.reliability()``:
            :class:`rs_interp.circuits.uncertainty.Spread`.
        per_span: (sender, receiver, span) each span's share (they sum to ``effect``), with ``spans=``;
            else None (:meth:`positional`: the positional edges).
        schema: the :class:`rs_interp.circuits.positions.PositionSchema` of ``per_span``.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)
        >>> node = rs_interp.attribution_patching(model, a, metric, reference=b)
        >>> totals = dict(zip(eap.layout.senders, eap.sender_totals().tolist()))
        >>> abs(totals["L0H1"] - float(node.effect[0, 1])) < 1e-6
        True
    """

    ig_steps: int | None = None
    ig_rule: str = "left"
    qk_fix: bool = False
    grad_drop: bool = False
    correction: str | None = None
    first_order: Float[torch.Tensor, "sender receiver"] | None = None
    per_example: Float[torch.Tensor, "batch sender receiver"] | None = None
    per_span: Float[torch.Tensor, "sender receiver span"] | None = None
    schema: PositionSchema | None = None


def _contract(buf: torch.Tensor, W: torch.Tensor, G: torch.Tensor, spans: torch.Tensor | None = None) -> torch.Tensor:
    """``W . G`` (rows of ``W`` against rows of ``G``, over batch * pos * d_model), (batch or 1, sender,
    column) as ``buf``'s first axis asks: one product per batch row in ``W``'s dtype (sums of pos *
    d_model terms), their results added in float64. With ``spans`` (batch, pos, span) one-hot, (batch or 1,
    sender, column, span): each position's d_model terms added into its span (:func:`._substrate.contract`)."""
    if spans is not None:
        return contract(W, G.view(G.shape[0], *W.shape[1:]), per_example=buf.shape[0] > 1, spans=spans)
    k, c, B = W.shape[0], G.shape[0], W.shape[1]
    per_row = torch.bmm(W.reshape(k, B, -1).transpose(0, 1), G.reshape(c, B, -1).permute(1, 2, 0)).to(torch.float64)
    return per_row if buf.shape[0] > 1 else per_row.sum(0, keepdim=True)


class _Pending(NamedTuple):
    """One reader's gradient waiting for its layer's product (:func:`_flush`)."""

    buf: torch.Tensor  # the estimate it adds into: a GradDrop round's first-order term, or the second-order term
    weight: float  # the point's weight
    W: torch.Tensor  # the senders' writes (sender, batch, pos, d_model)
    G: torch.Tensor  # its rows of the gradients (a view into the rows reused for every layer)
    cols: list[int]  # its receivers' columns
    k: int  # its senders: the first k writes


def _flush(pending: list[_Pending], rows: torch.Tensor, spans: torch.Tensor | None = None) -> None:
    """One product for the gradients gathered (one layer's readers, one pass and phase): the senders
    upstream of all of them (a prefix of the writes) against every column at once, then the few
    senders only some of them read, each reader alone. The ``G`` of ``pending`` are consecutive rows of
    ``rows`` from its first."""
    if not pending:
        return
    buf, weight, W = pending[0].buf, pending[0].weight, pending[0].W
    k0 = min(p.k for p in pending)
    G = rows[: sum(p.G.shape[0] for p in pending)]
    cols = [j for p in pending for j in p.cols]
    buf[:, :k0, cols] += weight * _contract(buf, W[:k0], G, spans)
    for p in pending:
        if p.k > k0:
            buf[:, k0:p.k, p.cols] += weight * _contract(buf, W[k0:p.k], p.G, spans)
    pending.clear()


@needs(*EDGE_ESTIMATES, adapts=QK_FIX)
@outside_inference_mode
def edge_attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    ig_steps: int | None = None,
    ig_rule: IGRule | str = "left",
    qk_fix: bool = False,
    grad_drop: bool = False,
    correction: str | None = None,
    per_example: bool = False,
    spans: str | PositionSchema | None = None,
    memory_budget: int = MEMORY_BUDGET,
    progress: bool = True,
) -> EdgeAttributionPatching:
    """Edge attribution patching of every edge of the model's graph, from one forward and one
    backward pass on ``tokens`` (``m`` of each with ``ig_steps=m``) plus one forward pass on
    ``reference``.

    ``effect[s, r]`` estimates ``metric(edge s -> r patched) - metric(run on tokens)``, where patching
    the edge adds the change of sender ``s``'s write, ``w_s = write_s(reference) - write_s(tokens)``,
    to receiver ``r``'s input only (every other reader keeps the run's):

        effect[s, r] = sum over batch and positions of w_s . d metric / d input_r

    Positive: patching that edge from the reference raises the metric; negative: lowers it. A
    sender's row sums to its node estimate (:func:`rs_interp.attribution_patching`). NaN where ``s``
    is not upstream of ``r`` (no edge).

    A head's q, k or v input gradient is read at ``hook_{q,k,v}`` (the per-head projection) and
    taken back through ``W_{Q,K,V}`` and the frozen LayerNorm by hand, on HookedTransformer's
    attention and TransformerLens 4's native attention: the forward pass stays the model's own, with
    no per-head copy of the stream. Elsewhere (shortformer positions, a Hugging Face-booted bridge's
    attention), and for the Hessian correction (which differentiates the norms too), TransformerLens's
    per-head input hooks are used (``use_split_qkv_input`` switched on for the call and restored).
    ``use_hook_mlp_in`` is switched on for the MLPs' inputs and restored.

    Args:
        model: a TransformerLens model (HookedTransformer on 3.x, TransformerBridge or
            HookedTransformer on 4.x) that :func:`rs_interp.certify` passes for this helper.
        tokens: (batch, pos) the run's tokens (the clean prompts).
        metric: a :data:`rs_interp.Metric`, differentiable: logits -> a scalar.
        reference: tokens of the reference run, the shape of ``tokens``.
        ig_steps, ig_rule: ``m`` for EAP-IG and which ``m`` points (``"left"``, ``"right"``: see
            :func:`rs_interp.attribution_patching`; ``"gauss"``: Gauss-Legendre); default plain.
        qk_fix: the QK fix for edges into query and key inputs (:mod:`rs_interp.circuits.atp_star`).
        grad_drop: GradDrop, ``L - 1`` more backward passes (a magnitude; :mod:`rs_interp.circuits.atp_star`).
        correction: ``"hessian"``, the second-order term at each point, one more backward pass
            through each (:mod:`rs_interp.circuits.correction`).
        per_example: keep each pair's share of every estimate (``per_example``, for error bars).
        spans: ``"each"`` (every position its own span) or a :class:`rs_interp.circuits.positions.PositionSchema`:
            also each span's share of every edge, ``per_span``, summing to ``effect``
            (:mod:`rs_interp.circuits.positions`).
        memory_budget: bytes one chunk of the QK fix's patched patterns (or stacked pass) may use (roughly).
        progress: a progress bar over the passes.

    Returns:
        An :class:`EdgeAttributionPatching`: ``effect`` (sender, receiver) as above, ``layout``,
        ``clean`` (the metric on ``tokens``), the options used, and ``first_order``/``per_example``
        when asked for.

    Raises:
        ValueError: bad tokens, options that do not combine (named), a model
            whose identities fail (:func:`rs_interp.certify`), or (the Hessian correction) attention
            that cannot be differentiated twice.

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = edge_attribution_patching(model, a, metric, reference=b, ig_steps=3)
        >>> eap.layout.n_edges, eap.ig_steps, int(eap.effect.isnan().sum())
        (29, 3, 36)
        >>> fixed = edge_attribution_patching(model, a, metric, reference=b, correction="hessian", per_example=True)
        >>> tuple(fixed.per_example.shape), bool((fixed.reliability().nan_to_num(0) <= 1).all())
        ((4, 5, 13), True)
    """
    tokens, reference = check_pair(model, tokens, reference)
    options = EstimateOptions(ig_steps=ig_steps, ig_rule=ig_rule, qk_fix=qk_fix, grad_drop=grad_drop,
                              correction=correction, per_example=per_example)
    schema, drops, cert = _refusals(model, tokens, options, spans)
    layout = edge_layout(model)
    with preserve_state(model, **mlp_flags(model)):
        gradients = _EdgeGradients(model, tokens, reference, options, layout, schema, len(drops))
        value = _gradient_passes(model, tokens, metric, gradients, drops, progress)
        value = clean_metric(model, tokens, metric, value)
        if options.qk_fix:
            _qk_fix(model, tokens, gradients, cert, memory_budget, progress)
    return _result(options, layout, schema, gradients, value, model.cfg.n_layers)


def _refusals(model: Model, tokens: torch.Tensor, options: EstimateOptions,
              spans: str | PositionSchema | None) -> tuple[PositionSchema | None, list[int | None], Certificate]:
    """The positions' schema, GradDrop's rounds (None: no layer dropped) and the certificate, or the refusal of
    what the options cannot estimate on this model (named)."""
    schema = resolve_spans(spans, tokens)
    if schema is not None and (options.qk_fix or options.grad_drop):
        raise ValueError("spans= splits a sum over positions; the QK fix (a pattern recomputed with every position "
                         "moved) and GradDrop (a sum of magnitudes) are not such sums: compute them without positions")
    drops = [None] + (check_drop_layers(model) if options.grad_drop else [])
    # the QK fix reads rows, scores, start at layer
    cert = require(model, "edge_attribution_patching", adapts=options.qk_fix)
    if options.hessian and _backend.has_post_norms(model):
        raise ValueError("correction='hessian' is not defined on post-norm blocks here: a head's edge writes through "
                         "the norm after its attention, whose curvature along the head's own change (P''(r)[d W_O, "
                         "d W_O], shared by every receiver) the edge's second-order term would have to split over "
                         "receivers; use the plain or integrated-gradients estimate, or path patching (exact)")
    return schema, drops, cert


class _EdgeGradients:
    """The estimate's terms, filled as the backward passes deliver each reader's gradient: the senders' writes
    (built when the first gradient arrives: the forward pass is over) against a layer's readers' gradients at
    once (:func:`_flush`). Owns the recorded runs, the buffers and the :class:`Passes` the hooks read.

    Attributes:
        first: per GradDrop round, the first-order term (batch or 1, sender, receiver[, span]), float64.
        second: the second-order term (the Hessian correction), the same shape.
        W: the senders' writes (for the QK fix), None until a gradient arrived.
        grads_z: per GradDrop round, ``dm/dz`` per layer (the QK fix's).
    """

    def __init__(self, model: Model, tokens: torch.Tensor, reference: torch.Tensor, options: EstimateOptions,
                 layout: EdgeLayout, schema: PositionSchema | None, n_rounds: int) -> None:
        self.model, self.options, self.passes = model, options, Passes()
        self.line = options.line
        B = tokens.shape[0]
        shape = (B if options.per_example else 1, len(layout.senders), len(layout.receivers))
        shape += () if schema is None else (schema.n_spans,)
        self.spans = None if schema is None else schema.one_hot()
        self.first = [torch.zeros(shape, dtype=torch.float64) for _ in range(n_rounds)]
        self.second = torch.zeros(shape, dtype=torch.float64)
        self.column = {r: j for j, r in enumerate(layout.receivers)}
        # per receiver: its senders are the first `upstream` (depth order)
        self.upstream = layout.exists.sum(0).tolist()
        self.grads_z: list[dict[int, torch.Tensor]] = [{} for _ in range(n_rounds)]
        self.points = sender_points(model)
        self.ref = record(model, reference, self.points)
        # Plain: the run's sender outputs are read in the pass itself. Else from a pass of their own
        # (the passes run at interpolated inputs).
        self.run: dict[str, torch.Tensor] = {} if options.plain_run else record(model, tokens, self.points)
        # The contraction in the model's dtype (float32 for a half-precision model; float64 under the
        # QK fix, whose corrections read the writes in float64): each product sums one batch row's
        # pos * d_model terms, and those results are added in float64 (_contract).
        self.dt = torch.float64 if options.qk_fix else compute_dtype(model)
        self.post_norm = _backend.has_post_norms(model)
        self.here: dict[str, torch.Tensor] = {}  # post-norm blocks, away from the run: this pass's heads' outputs
        self.rows = max(sum(len(r.labels) for r in readers(model) if r.layer == l) for l in range(model.cfg.n_layers))
        self.W: torch.Tensor | None = None
        self.grads: torch.Tensor | None = None  # (rows, batch * pos * d_model): the pending gradients, reused
        self.built: tuple[int, int] | None = None  # the pass the writes were built for
        self.key: tuple[int, int, int, int] | None = None  # (layer, round, point, phase) of the pending gradients
        self.pending: list[_Pending] = []  # one layer's readers' gradients, contracted together (_flush)

    def forward_hooks(self) -> list:
        """The forward hooks of every pass: the run's writes (plain), ``dm/dz`` (the QK fix), the heads' outputs
        (post-norm blocks away from the run, where their norms' Jacobians are taken)."""
        plain_run = self.options.plain_run
        fwd = store_matching(self.run, self.model, self.points) if plain_run else []
        fwd += z_gradients(self.grads_z, self.passes) if self.options.qk_fix else []
        if self.post_norm and not plain_run:
            fwd += store_matching(self.here, self.model, N.every(N.z))
        return fwd

    def on_grad(self, reader: Reader, fill: Callable[[torch.Tensor], None]) -> None:
        """A reader's gradient: its rows filled in place, contracted with its layer's (the senders upstream of a
        receiver are a contiguous prefix of the writes: one matrix product over (batch, pos, d_model))."""
        if self.W is None:  # built once, when the first gradient arrives (the forward is over)
            self._build()
        passes = self.passes
        now = (reader.layer, passes.drop, passes.point, passes.phase)
        if now != self.key:
            self.flush()
            self.key = now
            if self.here and self.built != passes.at():  # post-norm heads: the Jacobian at this pass's point
                self.W = writes(self.model, self.ref, self.run, at=self.here, dtype=self.dt)
                self.built = passes.at()
        at = sum(len(p.cols) for p in self.pending)
        G = self.grads[at : at + len(reader.labels)]
        fill(G)
        cols = [self.column[r] for r in reader.labels]
        if passes.phase == 1:
            buf, w = self.first[passes.drop], self.line.weights[passes.point]
        else:
            buf, w = self.second, self.line.seconds[passes.point]
        self.pending.append(_Pending(buf, w, self.W, G, cols, self.upstream[cols[0]]))

    def _build(self) -> None:
        self.W = writes(self.model, self.ref, self.run, at=self.here or None, dtype=self.dt)
        if not self.post_norm:  # held in the writes now (the passes keep their own x_ref); post-norm
            for box in (self.ref, self.run):  # blocks rebuild them at each pass's point, from these
                for name in [k for k in box if k != RESID0]:
                    del box[name]
        self.grads = torch.empty(self.rows, self.W[0].numel(), dtype=self.dt, device=self.W.device)
        self.built = self.passes.at()

    def flush(self) -> None:
        """Contract the pending gradients (:func:`_flush`)."""
        _flush(self.pending, self.grads, self.spans)

    def end_round(self) -> None:
        """After a GradDrop round's passes: its last layer contracted."""
        self.flush()
        self.key = None


def _gradient_passes(model: Model, tokens: torch.Tensor, metric: Metric, gradients: _EdgeGradients,
                     drops: list[int | None], progress: bool) -> float | None:
    """Every GradDrop round's passes (:func:`rs_interp.circuits.correction.run_passes`), each reader's gradient
    contracted as it arrives; the run's metric where a pass ran it, else None."""
    options, fwd = gradients.options, gradients.forward_hooks()
    for d, layer in enumerate(drops):
        gradients.passes.drop = d
        wanted = readers(model, projected=not options.hessian)
        with reader_gradients(model, wanted, gradients.on_grad, gradients.dt, extra=drop_hooks(model, layer)) as hooks:
            value = run_passes(model, tokens, metric, fwd + hooks, alphas=gradients.line.alphas,
                               hessian=options.hessian, x_ref=gradients.ref[RESID0], passes=gradients.passes,
                               progress=progress)
        gradients.end_round()
    return value


def _qk_fix(model: Model, tokens: torch.Tensor, gradients: _EdgeGradients, cert: Certificate, memory_budget: int,
            progress: bool) -> None:
    """The QK fix's edges into queries and keys in place of the first-order term's (AtP*)."""
    box = record(model, tokens, start_points(model, attention=True))
    layout = edge_layout(model)
    fixed = edge_qk_fix(model, layout, tokens, gradients.W, gradients.grads_z, box, cert,
                        gradients.options.per_example, memory_budget, progress)
    for buf, fix in zip(gradients.first, fixed):
        buf.copy_(torch.where(fix.isnan(), buf, fix))


def _result(options: EstimateOptions, layout: EdgeLayout, schema: PositionSchema | None, gradients: _EdgeGradients,
            value: float, n_layers: int) -> EdgeAttributionPatching:
    """The terms summed into the estimate: over spans last (float64), GradDrop's rounds combined, the Hessian
    term added, NaN where there is no edge."""
    first, second = gradients.first, gradients.second
    gone = ~layout.exists
    per_span = None
    if schema is not None:  # each span's share: the sum over spans is the estimate (summed last, in float64)
        per_span = (first[0] + second).sum(0)
        per_span[gone] = float("nan")
        first, second = [f.sum(-1) for f in first], second.sum(-1)
    if options.grad_drop:
        effect, shares, first_order = combine_drops([f[0] for f in first], n_layers), None, None
    elif options.hessian:
        shares = first[0] + second
        effect, first_order = shares.sum(0), first[0].sum(0)
        first_order[gone] = float("nan")
    else:
        shares, first_order = first[0], None
        effect = shares.sum(0)
    effect[gone] = float("nan")
    if options.per_example:
        shares[:, gone] = float("nan")
    return EdgeAttributionPatching(layout=layout, effect=effect, clean=value, ig_steps=options.ig_steps,
                                   ig_rule=options.ig_rule, qk_fix=options.qk_fix, grad_drop=options.grad_drop,
                                   correction=options.correction, first_order=first_order,
                                   per_example=shares if options.per_example else None, per_span=per_span,
                                   schema=schema)
