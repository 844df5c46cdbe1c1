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
from ..exact.certificate import Certificate, require
from ..exact.needs import QK_FIX, needs
from ..exact.stream import RESID0, mlp_flags, start_points, watched
from ..labels import head_label, kv_label
from ..metrics import Metric, top_effects
from ._substrate import IGRule, check_pair, outside_inference_mode, record
from .atp_star import check_drop_layers, combine_drops, dropped, node_qk_deltas, z_gradients
from .correction import Passes, clean_metric, run_passes
from .options import EstimateOptions
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
    options = EstimateOptions(ig_steps=ig_steps, ig_rule=ig_rule, qk_fix=qk_fix, grad_drop=grad_drop,
                              correction=correction, per_example=per_example)
    if which not in NODES:
        raise ValueError(f"which must be one of {NODES}, got {which!r}")
    if qk_fix and which not in ("q", "k"):
        raise ValueError(f"the QK fix recomputes the attention softmax after a query or key patch: which='q' or 'k', "
                         f"not {which!r} (nothing nonlinear lies between a head's value or output and its z)")
    drops = [None] + (check_drop_layers(model) if grad_drop else [])
    cert = require(model, "attribution_patching", adapts=qk_fix)  # the QK fix reads rows, scores, start at layer
    cfg = model.cfg
    n = kv_groups(cfg) if which in ("k", "v") else cfg.n_heads
    with preserve_state(model, **mlp_flags(model)):
        nodes = _NodeGradients(model, tokens, reference, options, which, n, len(drops))
        value = _node_passes(model, tokens, metric, nodes, drops, progress)
        value = clean_metric(model, tokens, metric, value)
        nodes.check_fired()
        if qk_fix:
            _node_qk_fix(model, tokens, nodes, cert, progress)
    labels = tuple((kv_label if n != cfg.n_heads else head_label)(l, h) for l in range(cfg.n_layers) for h in range(n))
    first, second = nodes.first, nodes.second
    per_position = None if (qk_fix or grad_drop) else (first[0] + second).sum(0)
    if grad_drop:
        effect, shares, first_order = combine_drops([f.sum((0, 3)) for f in first], cfg.n_layers), None, None
    else:
        shares = (first[0] + second).sum(-1)
        effect = shares.sum(0)
        first_order = first[0].sum((0, 3)) if options.hessian else None
    return AttributionPatching(effect=effect, effect_per_position=per_position, clean=value, labels=labels,
                               ig_steps=ig_steps, ig_rule=ig_rule, which=which, qk_fix=qk_fix, grad_drop=grad_drop,
                               correction=correction, first_order=first_order,
                               per_example=shares if per_example else None)


class _NodeGradients:
    """The estimate's terms, filled as the backward passes deliver each node's gradient (contracted with the
    node's patch direction ``x_ref - x`` at once). Owns the recorded runs, the buffers and the :class:`Passes`.

    Attributes:
        first: per GradDrop round, the first-order term (batch or 1, layer, head, pos), float64.
        second: the second-order term (the Hessian correction), the same shape.
        grads_z: per GradDrop round, ``dm/dz`` per layer (the QK fix's).
        fired: the layers whose node received a gradient.
    """

    def __init__(self, model: Model, tokens: torch.Tensor, reference: torch.Tensor, options: EstimateOptions,
                 which: str, n: int, n_rounds: int) -> None:
        self.options, self.which, self.passes, self.line = options, which, Passes(), options.line
        L, P, B = model.cfg.n_layers, tokens.shape[1], tokens.shape[0]
        self.n_layers, self.n = L, n
        shape = (B if options.per_example else 1, L, n, P)
        self.first = [torch.zeros(shape, dtype=torch.float64) for _ in range(n_rounds)]
        self.second = torch.zeros(shape, dtype=torch.float64)
        self.node_point = N.z if which == "z" else (lambda l: N.projection(l, which))
        self.is_node = N.every(self.node_point)
        self.fired: set[int] = set()
        self.grads_z: list[dict[int, torch.Tensor]] = [{} for _ in range(n_rounds)]
        self.ref = record(model, reference, lambda name: self.is_node(name) or name == RESID0)
        # Plain: the run's own activation, read in the pass. Else from a pass of its own (the passes
        # run at interpolated inputs).
        self.clean = {} if options.plain_run else record(model, tokens, self.is_node)

    def forward_hooks(self) -> list:
        """The node hook of every pass, and ``dm/dz`` under the QK fix."""
        return [(self.is_node, self.on_node)] + (z_gradients(self.grads_z, self.passes) if self.options.qk_fix else [])

    def on_node(self, t: torch.Tensor, *, hook) -> torch.Tensor:
        """A node's activation: its gradient, when it arrives, contracted with the node's patch direction."""
        clean = self.clean
        delta = (self.ref[hook.name] - (clean[hook.name] if clean else t.detach())).to(torch.float64)
        l = N.layer_of(hook.name)

        def contract(grad: torch.Tensor) -> None:
            self.fired.add(l)
            passes = self.passes
            if passes.phase == 1:
                buf, w = self.first[passes.drop], self.line.weights[passes.point]
            else:
                buf, w = self.second, self.line.seconds[passes.point]
            g = grad.detach().to(torch.float64)
            if buf.shape[0] > 1:
                buf[:, l] += w * einsum(delta, g, "b p n d, b p n d -> b n p")
            else:
                buf[0, l] += w * einsum(delta, g, "b p n d, b p n d -> n p")

        return watched(t, contract)

    def check_fired(self) -> None:
        """Refuse nodes off the forward path (no gradient reached them: the patch would change nothing)."""
        if len(self.fired) < self.n_layers:
            missing = min(set(range(self.n_layers)) - self.fired)
            raise ValueError(f"{self.node_point(missing)} got no gradient: on this model it is off the forward path "
                             f"(the patch would change nothing), so {self.which!r} nodes cannot be estimated; "
                             "try which='z'")


def _node_passes(model: Model, tokens: torch.Tensor, metric: Metric, nodes: _NodeGradients, drops: list[int | None],
                 progress: bool) -> float | None:
    """Every GradDrop round's passes (:func:`rs_interp.circuits.correction.run_passes`); the run's metric where a
    pass ran it, else None."""
    fwd = nodes.forward_hooks()
    for d, layer in enumerate(drops):
        nodes.passes.drop = d
        with dropped(model, layer, fwd) as hooks:
            value = run_passes(model, tokens, metric, hooks, alphas=nodes.line.alphas, hessian=nodes.options.hessian,
                               x_ref=nodes.ref[RESID0], passes=nodes.passes, progress=progress)
    return value


def _node_qk_fix(model: Model, tokens: torch.Tensor, nodes: _NodeGradients, cert: Certificate, progress: bool) -> None:
    """The QK fix's query or key nodes in place of the first-order term (AtP*): each at position 0 of its row."""
    box = record(model, tokens, start_points(model))
    moved = node_qk_deltas(model, tokens, nodes.ref, box, cert, nodes.which, progress)
    B, n = tokens.shape[0], nodes.n
    group = model.cfg.n_heads // n
    for buf, grads in zip(nodes.first, nodes.grads_z):
        for l in range(nodes.n_layers):
            # heads -> their KV head
            part = einsum(moved[l], grads[l], "b p h d, b p h d -> b h").reshape(B, n, group).sum(-1)
            buf[:, l] = 0.0
            buf[:, l, :, 0] = part if buf.shape[0] > 1 else part.sum(0, keepdim=True)
