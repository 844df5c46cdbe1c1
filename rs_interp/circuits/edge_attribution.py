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
from typing import Callable

import torch
from jaxtyping import Float, Int

from .. import _backend
from .. import _names as N
from .._backend import Model
from .._budget import MEMORY_BUDGET
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import EDGE_ESTIMATES, QK_FIX, needs
from ..exact.readout import compute_dtype
from ..exact.stream import RESID0, Reader, mlp_flags, reader_gradients, readers, start_points
from ..hooks import store_matching
from ..metrics import Metric
from ._substrate import IGRule, check_pair, contract, outside_inference_mode, record, sender_points, writes
from .atp_star import check_drop_layers, combine_drops, drop_hooks, edge_qk_fix, z_gradients
from .correction import clean_metric, quadrature, run_passes
from .graph import EdgeEffects, edge_layout
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


def check_options(ig_steps: int | None, qk_fix: bool, grad_drop: bool, correction: str | None, per_example: bool) -> None:
    """Refuse the combinations that have no single definition (named)."""
    for name, value in (("qk_fix", qk_fix), ("grad_drop", grad_drop), ("per_example", per_example)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if (qk_fix or grad_drop) and (ig_steps is not None or correction is not None):
        raise ValueError("the QK fix and GradDrop (AtP*) correct the gradient at the run itself: they do not combine with "
                         "ig_steps or correction (run them as separate estimates)")
    if grad_drop and per_example:
        raise ValueError("GradDrop scores the sum of |estimate| over its passes: it has no per-pair shares (per_example); "
                         "bootstrap the plain or QK-fixed estimate instead")


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


def _flush(pending: list, rows: list[torch.Tensor], spans: torch.Tensor | None = None) -> None:
    """One product for the gradients gathered (one layer's readers, one pass and phase): the senders
    upstream of all of them (a prefix of the writes) against every column at once, then the few
    senders only some of them read, each reader alone. ``pending``: (buf, weight, W, G, cols, k), the
    ``G`` consecutive rows of ``rows[0]`` from its first."""
    if not pending:
        return
    buf, weight, W = pending[0][0], pending[0][1], pending[0][2]
    k0 = min(p[5] for p in pending)
    G = rows[0][: sum(p[3].shape[0] for p in pending)]
    cols = [j for p in pending for j in p[4]]
    buf[:, :k0, cols] += weight * _contract(buf, W[:k0], G, spans)
    for _, _, _, g, c, k in pending:
        if k > k0:
            buf[:, k0:k, c] += weight * _contract(buf, W[k0:k], g, spans)
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
            also each span's share of every edge, ``per_span``, summing to ``effect`` (:mod:`rs_interp.circuits.positions`).
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
    alphas, weights, seconds = quadrature(ig_steps, ig_rule, correction)
    check_options(ig_steps, qk_fix, grad_drop, correction, per_example)
    schema = resolve_spans(spans, tokens)
    if schema is not None and (qk_fix or grad_drop):
        raise ValueError("spans= splits a sum over positions; the QK fix (a pattern recomputed with every position moved) "
                         "and GradDrop (a sum of magnitudes) are not such sums: compute them without positions")
    drops = [None] + (check_drop_layers(model) if grad_drop else [])
    cert = require(model, "edge_attribution_patching", adapts=qk_fix)  # the QK fix reads rows, scores, start at layer
    hessian = correction == "hessian"
    if hessian and _backend.has_post_norms(model):
        raise ValueError("correction='hessian' is not defined on post-norm blocks here: a head's edge writes through the "
                         "norm after its attention, whose curvature along the head's own change (P''(r)[d W_O, d W_O], shared "
                         "by every receiver) the edge's second-order term would have to split over receivers; use the plain "
                         "or integrated-gradients estimate, or path patching (exact)")
    layout = edge_layout(model)
    B = tokens.shape[0]
    shape = (B if per_example else 1, len(layout.senders), len(layout.receivers)) + (() if schema is None else (schema.n_spans,))
    spans = None if schema is None else schema.one_hot()
    first = [torch.zeros(shape, dtype=torch.float64) for _ in drops]
    second = torch.zeros(shape, dtype=torch.float64)
    column = {r: j for j, r in enumerate(layout.receivers)}
    upstream = layout.exists.sum(0).tolist()  # per receiver: its senders are the first `upstream` (depth order)
    points = sender_points(model)
    state: dict = {}
    grads_z: list[dict[int, torch.Tensor]] = [{} for _ in drops]  # per GradDrop round, dm/dz per layer (the QK fix's)
    with preserve_state(model, **mlp_flags(model)):
        ref = record(model, reference, points)
        # Plain: the run's sender outputs are read in the pass itself. Else from a pass of their own
        # (the passes run at interpolated inputs).
        plain_run = alphas == [1.0] and not hessian
        run: dict[str, torch.Tensor] = {} if plain_run else record(model, tokens, points)
        stack: list[torch.Tensor] = []
        # The contraction in the model's dtype (float32 for a half-precision model; float64 under the
        # QK fix, whose corrections read the writes in float64): each product sums one batch row's
        # pos * d_model terms, and those results are added in float64 (_contract).
        dt = torch.float64 if qk_fix else compute_dtype(model)
        pending: list = []  # one layer's readers' gradients, contracted together (_flush)
        post_norm = _backend.has_post_norms(model)
        here: dict[str, torch.Tensor] = {}  # post-norm blocks, away from the run: this pass's heads' outputs
        built: list = [None]  # the pass the writes were built for
        now_pass = lambda: (state["drop"], state["point"])  # noqa: E731
        key: list = [None]
        rows = max(sum(len(r.labels) for r in readers(model) if r.layer == l) for l in range(model.cfg.n_layers))
        grads: list[torch.Tensor] = []  # (rows, batch * pos * d_model): the pending gradients, reused

        def on_grad(reader: Reader, fill: Callable[[torch.Tensor], None]) -> None:
            # The senders upstream of a receiver are a contiguous prefix of the writes: one matrix
            # product over (batch, pos, d_model) against the gradients of a layer's readers, with no copy of them.
            if not stack:  # built once, when the first gradient arrives (the forward is over)
                stack.append(writes(model, ref, run, at=here or None, dtype=dt))
                if not post_norm:  # held in the writes now (the passes keep their own x_ref); post-norm
                    for box in (ref, run):  # blocks rebuild them at each pass's point, from these
                        for name in [k for k in box if k != RESID0]:
                            del box[name]
                grads.append(torch.empty(rows, stack[0][0].numel(), dtype=dt, device=stack[0].device))
                built[0] = now_pass()
            now = (reader.layer, state["drop"], state["point"], state["phase"])
            if now != key[0]:
                _flush(pending, grads, spans)
                key[0] = now
                if here and built[0] != now_pass():  # post-norm heads: the Jacobian at this pass's point
                    stack[0] = writes(model, ref, run, at=here, dtype=dt)
                    built[0] = now_pass()
            at = sum(len(p[4]) for p in pending)
            G = grads[0][at : at + len(reader.labels)]
            fill(G)
            cols = [column[r] for r in reader.labels]
            if state["phase"] == 1:
                buf, w = first[state["drop"]], weights[state["point"]]
            else:
                buf, w = second, seconds[state["point"]]
            pending.append((buf, w, stack[0], G, cols, upstream[cols[0]]))

        fwd = (store_matching(run, model, points) if plain_run else []) + (z_gradients(grads_z, state) if qk_fix else [])
        if post_norm and not plain_run:  # each pass's heads' outputs: where its post-norms' Jacobians are taken
            fwd += store_matching(here, model, N.every(N.z))
        for d, layer in enumerate(drops):
            state["drop"] = d
            wanted = readers(model, projected=not hessian)
            with reader_gradients(model, wanted, on_grad, dt, extra=drop_hooks(model, layer)) as hooks:
                value = run_passes(model, tokens, metric, fwd + hooks, alphas=alphas, hessian=hessian, x_ref=ref[RESID0],
                                   state=state, progress=progress)
            _flush(pending, grads, spans)
            key[0] = None
        value = clean_metric(model, tokens, metric, value)
        if qk_fix:
            box = record(model, tokens, start_points(model, attention=True))
            fixed = edge_qk_fix(model, layout, tokens, stack[0], grads_z, box, cert, per_example, memory_budget, progress)
            for buf, fix in zip(first, fixed):
                buf.copy_(torch.where(fix.isnan(), buf, fix))
    gone = ~layout.exists
    per_span = None
    if schema is not None:  # each span's share: the sum over spans is the estimate (summed last, in float64)
        per_span = (first[0] + second).sum(0)
        per_span[gone] = float("nan")
        first, second = [f.sum(-1) for f in first], second.sum(-1)
    if grad_drop:
        effect, shares, first_order = combine_drops([f[0] for f in first], model.cfg.n_layers), None, None
    elif hessian:
        shares = first[0] + second
        effect, first_order = shares.sum(0), first[0].sum(0)
        first_order[gone] = float("nan")
    else:
        shares, first_order = first[0], None
        effect = shares.sum(0)
    effect[gone] = float("nan")
    if per_example:
        shares[:, gone] = float("nan")
    return EdgeAttributionPatching(layout=layout, effect=effect, clean=value, ig_steps=ig_steps, ig_rule=ig_rule, qk_fix=qk_fix,
                                   grad_drop=grad_drop, correction=correction, first_order=first_order,
                                   per_example=shares if per_example else None, per_span=per_span, schema=schema)
