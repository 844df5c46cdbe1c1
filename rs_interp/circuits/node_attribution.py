"""Attribution patching: a first-order estimate of every activation patch, from one backward pass.

Patching head ``h``'s ``z`` from a reference run into this run moves a metric by about

    AtP(h) = sum over batch and positions of (z_ref - z) . d metric / d z          (node level)

an exact derivative of the metric along the patch (tested against finite differences to 1e-6 in
float64); how well it predicts the real patch is a separate question, answered by comparing with
:func:`rs_interp.head_ablation_scan` (attention saturation is the usual failure) or refined with
``ig_steps`` (EAP-IG). Edges: :mod:`rs_interp.circuits.edge_attribution`.

``which="q"``, ``"k"`` or ``"v"`` patches each head's query, key or value (``hook_q`` / ``hook_k`` /
``hook_v``, per key/value head under grouped-query attention) instead of its output. Options:
``qk_fix`` (query and key nodes) and ``grad_drop`` (AtP*, :mod:`rs_interp.circuits.atp_star`),
``correction="hessian"`` (:mod:`rs_interp.circuits.correction`), ``per_example`` (each pair's share,
for error bars: :class:`rs_interp.circuits.uncertainty.Spread`).

One forward pass records ``z``; the backward pass contracts each gradient with the patch directions
as soon as it is computed (tensor hooks), so no gradient tensor of the whole model is held, and no
parameter ever receives a ``.grad``.

>>> from rs_interp import load_toy_model, induction_batch
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
>>> atp = attribution_patching(model, a, lambda logits: logits[:, -1, 0].mean(), reference=b)
>>> tuple(atp.effect.shape), len(atp.top(3))
((2, 2), 3)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model, kv_groups
from .._keywords import renamed, renamed_attribute
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import QK_FIX, needs
from ..exact.stream import RESID0, mlp_flags, start_points, watched
from ..labels import head_label, kv_label
from ..metrics import Metric, top_effects
from ._substrate import IGRule, check_pair, outside_inference_mode, record
from .atp_star import check_drop_layers, combine_drops, dropped, node_qk_deltas, z_gradients
from .correction import clean_metric, quadrature, run_passes
from .edge_attribution import check_options
from .uncertainty import Spread

__all__ = ["AttributionPatching", "attribution_patching", "NODES"]

#: What a node is: each head's output ``z``, or its query, key or value.
NODES = ("z", "q", "k", "v")


@dataclass(frozen=True)
class AttributionPatching(Spread):
    """Node-level estimates.

    Attributes:
        effect: (layer, head) the estimated change of the metric when the head's ``z`` (or its
            ``which``) is patched from the reference run (summed over positions); (layer, kv_head)
            for keys and values under grouped-query attention.
        effect_per_position: (layer, head, pos) the same before the sum over positions; None under
            the QK fix and GradDrop (not sums over the patched positions).
        clean: the metric of the run on ``tokens``.
        labels: ``"L{l}H{h}"`` (``"L{l}KV{g}"``) row-major (:func:`rs_interp.head_labels`).
        ig_steps, ig_rule: EAP-IG's ``m`` and its rule (None: plain attribution patching).
        which, qk_fix, grad_drop, correction: the options the estimate was computed with.
        first_order: with the correction, the estimate without it; else None.
        per_example: (batch, layer, head) each pair's share, with ``per_example=True``; else None.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> atp = rs_interp.attribution_patching(model, a, metric, reference=b)
        >>> bool(atp.effect_per_position.sum(-1).allclose(atp.effect)), len(atp.top(3))
        (True, 3)
    """

    effect: Float[torch.Tensor, "layer head"]
    effect_per_position: Float[torch.Tensor, "layer head pos"] | None
    clean: float
    labels: tuple[str, ...]
    ig_steps: int | None = None
    ig_rule: str = "left"
    which: str = "z"
    qk_fix: bool = False
    grad_drop: bool = False
    correction: str | None = None
    first_order: Float[torch.Tensor, "layer head"] | None = None
    per_example: Float[torch.Tensor, "batch layer head"] | None = None

    nodes = renamed_attribute("nodes", "which")

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads with the largest estimated ``|effect|``, with their effect."""
        return top_effects(self.labels, self.effect, k)


@needs("z", "input", "gradients", adapts=QK_FIX)
@renamed(nodes="which")
@outside_inference_mode
def attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    ig_steps: int | None = None,
    ig_rule: IGRule | str = "left",
    which: str = "z",
    qk_fix: bool = False,
    grad_drop: bool = False,
    correction: str | None = None,
    per_example: bool = False,
    progress: bool = True,
) -> AttributionPatching:
    """Node-level attribution patching of every head's ``z`` (module docstring): one forward and one
    backward pass on ``tokens``, plus one forward pass on ``reference``.

    Args:
        metric: a :data:`rs_interp.Metric`, differentiable (e.g. :func:`rs_interp.next_token_loss`).
        reference: tokens of the reference run, the shape of ``tokens``.
        ig_steps: ``m`` for EAP-IG (Hanna et al. 2024): the gradient averaged over the ``m`` points
            ``x_ref + (k/m)(x - x_ref)`` on the line from the reference's input embedding (the
            stream entering block 0) to the run's, contracted with the same ``z_ref - z`` as plain
            attribution patching. As ``m`` grows the average tends to the integral of the gradient
            along the line (error O(1/m)). Default: plain (the gradient at the run itself).
        ig_rule: which ``m`` points: ``"left"``, ``k = 0 .. m - 1`` (the reference's endpoint, as
            Hanna et al.'s code: the default), ``"right"``, ``k = 1 .. m`` (the run's endpoint;
            with ``m = 1`` plain attribution patching), or ``"gauss"`` (Gauss-Legendre points and weights).
        which: each head's node: ``"z"`` (its output), ``"q"``, ``"k"`` or ``"v"`` (its query, key or
            value input).
        qk_fix: the QK fix, for ``which="q"`` or ``"k"`` (:mod:`rs_interp.circuits.atp_star`).
        grad_drop: GradDrop, ``L - 1`` more backward passes (a magnitude).
        correction: ``"hessian"``: the second-order term (:mod:`rs_interp.circuits.correction`).
        per_example: keep each pair's share (``per_example``).
        progress: a progress bar over the passes.

    Raises:
        ValueError: bad tokens or options (named), the QK fix on ``z`` or ``v`` nodes, a node hook off
            the forward path, a model whose identities fail.

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> atp = attribution_patching(model, a, metric, reference=b)
        >>> tuple(atp.effect.shape), atp.labels[:2]
        ((2, 2), ('L0H0', 'L0H1'))
        >>> attribution_patching(model, a, metric, reference=b, which="k", qk_fix=True).labels[:2]
        ('L0H0', 'L0H1')
    """
    tokens, reference = check_pair(model, tokens, reference)
    alphas, weights, seconds = quadrature(ig_steps, ig_rule, correction)
    check_options(ig_steps, qk_fix, grad_drop, correction, per_example)
    if which not in NODES:
        raise ValueError(f"which must be one of {NODES}, got {which!r}")
    if qk_fix and which not in ("q", "k"):
        raise ValueError(f"the QK fix recomputes the attention softmax after a query or key patch: which='q' or 'k', not {which!r} "
                         "(nothing nonlinear lies between a head's value or output and its z)")
    drops = [None] + (check_drop_layers(model) if grad_drop else [])
    cert = require(model, "attribution_patching", adapts=qk_fix)  # the QK fix reads rows, scores, start at layer
    cfg = model.cfg
    L, P, B = cfg.n_layers, tokens.shape[1], tokens.shape[0]
    n = kv_groups(cfg) if which in ("k", "v") else cfg.n_heads
    hessian = correction == "hessian"
    shape = (B if per_example else 1, L, n, P)
    first = [torch.zeros(shape, dtype=torch.float64) for _ in drops]
    second = torch.zeros(shape, dtype=torch.float64)
    node_point = N.z if which == "z" else (lambda l: N.projection(l, which))
    is_node = N.every(node_point)
    fired: set[int] = set()
    grads_z: list[dict[int, torch.Tensor]] = [{} for _ in drops]
    state: dict = {}
    with preserve_state(model, **mlp_flags(model)):
        ref = record(model, reference, lambda name: is_node(name) or name == RESID0)
        # Plain: the run's own activation, read in the pass. Else from a pass of its own (the passes
        # run at interpolated inputs).
        plain_run = alphas == [1.0] and not hessian
        clean = {} if plain_run else record(model, tokens, is_node)

        def on_node(t: torch.Tensor, *, hook) -> torch.Tensor:
            delta = (ref[hook.name] - (clean[hook.name] if clean else t.detach())).to(torch.float64)
            l = N.layer_of(hook.name)

            def contract(grad: torch.Tensor) -> None:
                fired.add(l)
                buf, w = (first[state["drop"]], weights[state["point"]]) if state["phase"] == 1 else (second, seconds[state["point"]])
                g = grad.detach().to(torch.float64)
                if buf.shape[0] > 1:
                    buf[:, l] += w * einsum(delta, g, "b p n d, b p n d -> b n p")
                else:
                    buf[0, l] += w * einsum(delta, g, "b p n d, b p n d -> n p")

            return watched(t, contract)

        fwd = [(is_node, on_node)] + (z_gradients(grads_z, state) if qk_fix else [])
        for d, layer in enumerate(drops):
            state["drop"] = d
            with dropped(model, layer, fwd) as hooks:
                value = run_passes(model, tokens, metric, hooks, alphas=alphas, hessian=hessian, x_ref=ref[RESID0], state=state,
                                   progress=progress)
        value = clean_metric(model, tokens, metric, value)
        if len(fired) < L:
            missing = min(set(range(L)) - fired)
            raise ValueError(f"{node_point(missing)} got no gradient: on this model it is off the forward path (the "
                             f"patch would change nothing), so {which!r} nodes cannot be estimated; try which='z'")
        if qk_fix:
            box = record(model, tokens, start_points(model))
            moved = node_qk_deltas(model, tokens, ref, box, cert, which, progress)
            group = cfg.n_heads // n
            for buf, grads in zip(first, grads_z):
                for l in range(L):
                    part = einsum(moved[l], grads[l], "b p h d, b p h d -> b h").reshape(B, n, group).sum(-1)  # heads -> their KV head
                    buf[:, l] = 0.0
                    buf[:, l, :, 0] = part if buf.shape[0] > 1 else part.sum(0, keepdim=True)
    labels = tuple((kv_label if n != cfg.n_heads else head_label)(l, h) for l in range(L) for h in range(n))
    per_position = None if (qk_fix or grad_drop) else (first[0] + second).sum(0)
    if grad_drop:
        effect, shares, first_order = combine_drops([f.sum((0, 3)) for f in first], L), None, None
    else:
        shares = (first[0] + second).sum(-1)
        effect = shares.sum(0)
        first_order = first[0].sum((0, 3)) if hessian else None
    return AttributionPatching(effect=effect, effect_per_position=per_position, clean=value, labels=labels, ig_steps=ig_steps,
                               ig_rule=ig_rule, which=which, qk_fix=qk_fix, grad_drop=grad_drop, correction=correction,
                               first_order=first_order, per_example=shares if per_example else None)
