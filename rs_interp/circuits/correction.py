"""The second-order (Hessian) correction of attribution patching, and the passes every estimate runs.

**The line.** EAP-IG (Hanna et al. 2024) integrates each receiver's input gradient ``g_r(alpha)``
along the line on which the stream entering block 0 moves from the reference's (``alpha = 0``) to
the run's (``alpha = 1``), ``x(alpha) = x_ref + alpha (x - x_ref)``, everything downstream
recomputed: ``IG(s -> r) = integral_0^1 w_s . g_r(alpha) d alpha`` (``w_s = write_ref - write``; for
a head's ``z`` node, ``delta = z_ref - z`` against ``dm/dz``). Attribution patching is its one-point
rule at the run, ``w_s . g_r(1)``.

**The Hessian correction** (Zhang & Wang 2026, "When attribution patching lies") adds the next term
of the expansion in the step: over a segment of length ``h`` ending at a point ``alpha_k`` (the
``"right"`` rule; plain attribution patching is ``alpha = 1``, ``h = 1``),

    integral over the segment of g = h g(alpha_k) - (h^2 / 2) g'(alpha_k) + O(h^3),

and ``+ (h^2 / 2) g'(alpha_k)`` over a segment starting at ``alpha_k`` (``"left"``), where
``g' = d g_r / d alpha`` is the change of the receiver's gradient along the line, a Hessian-vector
product (the Hessian of the metric in the receivers' inputs, against the direction the line moves
them). So

    corrected(s -> r) = w_s . g_r(1) - (1/2) w_s . g_r'(1)                          (one point)

and with ``ig_steps = m`` the sum over the ``m`` points, ``h = 1/m`` (the multi-step variant: error
``O(h^2)`` against EAP-IG's ``O(h)``). Each point costs one forward pass, one backward pass that keeps
its graph and one more backward pass through it (double backward): ``g'`` comes from
``d/dc_r (dm/d alpha)`` at every receiver input ``c_r`` at once (mixed partials commute). Where the
metric is a quadratic function of the patched activation, and the activation moves on a straight line
that the patch spans (a single-position head, no norm), the one-point correction is the exact patch
(tested to 1e-9 against exact patching); in general it is exact to second order in the step.

**Reliability** (:meth:`rs_interp.circuits.uncertainty.Spread.reliability`): ``|first| / (|first| +
|second|)``, below 1/2 where the correction outweighs the first-order term.

**Double backward** needs attention that autograd can differentiate twice: TransformerLens's own
(both versions) can; a fused kernel (a Hugging Face module running scaled-dot-product attention)
cannot, and the estimate refuses, saying so.

**Gauss-Legendre** (``ig_rule="gauss"``): EAP-IG at the ``m`` Gauss-Legendre points of the line with
their weights, exact for gradients polynomial of degree ``2m - 1`` in ``alpha`` (the Riemann rules:
degree 0).

>>> [[round(x, 6) for x in part] for part in gauss_points(2)]
[[0.211325, 0.788675], [0.5, 0.5]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Bool

from .. import _backend
from .. import _names as N
from .._backend import Model
from .._budget import MEMORY_BUDGET
from .._progress import bar
from ..exact.certificate import require
from ..exact.needs import EDGE_ESTIMATES, ONE_PASS_EACH, needs
from ..exact.readout import final_norm_of
from ..exact.stream import RESID0, reader_weight
from ..exact.validate import check_int_range
from ..labels import parse
from ..metrics import Metric
from ._substrate import IG_RULES, backward, check_pair, ig_alphas, needs_gradients, scalar_metric, scalar_metric_value
from .graph import EdgeEffects, edge_layout
from .uncertainty import FLAT

__all__ = ["CORRECTIONS", "RULES", "Fixed", "Passes", "gauss_points", "quadrature", "run_passes", "clean_metric",
           "fix_unreliable", "moving_edges"]

#: The corrections an estimate takes (``correction=``): None, or ``"hessian"``.
CORRECTIONS = (None, "hessian")
#: EAP-IG's rules: the Riemann sums and Gauss-Legendre.
RULES = (*IG_RULES, "gauss")


def gauss_points(m: int) -> tuple[list[float], list[float]]:
    """The ``m`` Gauss-Legendre points on [0, 1] and their weights (summing to 1), from the
    eigen-decomposition of the Jacobi matrix (Golub-Welsch), in float64."""
    m = check_int_range("ig_steps", m, 1)
    k = torch.arange(1, m, dtype=torch.float64)
    off = k / (4 * k**2 - 1).sqrt()
    nodes, vectors = torch.linalg.eigh(torch.diag(off, 1) + torch.diag(off, -1))
    weights = vectors[0] ** 2
    return ((nodes + 1) / 2).tolist(), (weights / weights.sum()).tolist()  # summing to 1: constants integrate exactly


def quadrature(ig_steps: int | None, ig_rule: str,
               correction: str | None) -> tuple[list[float], list[float], list[float]]:
    """The points ``alpha_k`` of the line, the weight of each gradient and the weight of each
    gradient's derivative ``g'(alpha_k)`` (the Hessian term; zeros without it): module docstring.

    >>> quadrature(None, "left", "hessian"), quadrature(2, "left", "hessian")[2]
    (([1.0], [1.0], [-0.5]), [0.125, 0.125])
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    if ig_rule not in RULES:
        raise ValueError(f"ig_rule must be one of {RULES}, got {ig_rule!r}")
    if ig_rule == "gauss":
        if ig_steps is None:
            raise ValueError("ig_rule='gauss' integrates along the line: give ig_steps, the number of points")
        if correction is not None:
            raise ValueError("the Hessian correction expands a Riemann segment (ig_rule 'left' or 'right'); "
                             "Gauss-Legendre points are already exact to degree 2m - 1")
        alphas, weights = gauss_points(ig_steps)
        return alphas, weights, [0.0] * len(alphas)
    alphas = ig_alphas(ig_steps, ig_rule)
    h = 1.0 / len(alphas)
    right = ig_steps is None or ig_rule == "right"  # plain attribution patching: the segment [0, 1] ending at the run
    second = [(-1 if right else 1) * h * h / 2] * len(alphas) if correction else [0.0] * len(alphas)
    return alphas, [h] * len(alphas), second


@dataclass
class Passes:
    """Which pass the gradient hooks see (written by :func:`run_passes` and the estimate's loop over GradDrop's
    rounds, read by the tensor hooks that contract each gradient as it arrives).

    Attributes:
        drop: the GradDrop round (0: no layer dropped; :mod:`rs_interp.circuits.atp_star`).
        point: the index of the point on the line (:func:`quadrature`).
        phase: 1 while the hooks see the gradient, 2 while they see its derivative along the line (the Hessian term).

    Example:
        >>> passes = Passes()
        >>> passes.drop, passes.point, passes.phase, passes.at()
        (0, 0, 1, (0, 0))
    """

    drop: int = 0
    point: int = 0
    phase: int = 1

    def at(self) -> tuple[int, int]:
        """(round, point): the pass, whatever its phase."""
        return self.drop, self.point


def run_passes(model: Model, tokens: torch.Tensor, metric: Metric, fwd: list, *, alphas: Sequence[float], hessian: bool,
               x_ref: torch.Tensor | None, passes: Passes, progress: bool) -> float:
    """One pass per point ``alpha``: forward with ``fwd`` (whose tensor hooks read ``passes``),
    backward, and with ``hessian`` a second backward of ``dm / d alpha`` through the first.

    ``passes.point`` is the point's index, ``passes.phase`` 1 while the hooks see the gradient,
    2 while they see its derivative along the line. Returns the run's metric where ``1`` is among
    ``alphas`` (its own pass), else None: the caller measures it once its hooks are gone (:func:`clean_metric`).

    Raises:
        ValueError: inference-mode weights, or (with ``hessian``) attention autograd cannot
            differentiate twice.
    """
    clean = None
    steps = list(enumerate(alphas))
    for i, alpha in bar(steps, desc="gradient passes", enabled=progress and len(alphas) > 1, unit="pass"):
        passes.point, passes.phase = i, 1
        hooks = list(fwd)
        if not hessian:
            # Plain points keep the substrate's pass: the run itself at alpha = 1, bit for bit.
            interp = [] if alpha == 1.0 else [
                (RESID0, lambda t, *, hook, a=alpha: x_ref.to(t.dtype) + a * (t - x_ref.to(t.dtype)))]
            value = backward(model, tokens, metric, interp + hooks)
        else:
            value = _hessian_pass(model, tokens, metric, hooks, alpha, x_ref, passes)
        if alpha == 1.0:
            clean = value
    return clean


def clean_metric(model: Model, tokens: torch.Tensor, metric: Metric, value: float | None) -> float:
    """``value``, or the run's metric from a no-grad forward pass where the passes did not run it."""
    if value is not None:
        return value
    with torch.no_grad():
        return scalar_metric_value(metric, model(tokens, return_type="logits"), "clean run")


def _hessian_pass(model: Model, tokens: torch.Tensor, metric: Metric, hooks: list, alpha: float, x_ref: torch.Tensor,
                  passes: Passes) -> float:
    with torch.enable_grad():
        a = torch.tensor(float(alpha), dtype=model.cfg.dtype, requires_grad=True)

        def interpolate(t: torch.Tensor, *, hook) -> torch.Tensor:
            return x_ref.to(t.dtype) + a * (t - x_ref.to(t.dtype))

        with model.hooks(fwd_hooks=[(RESID0, interpolate)] + hooks):
            with needs_gradients():
                value = scalar_metric(metric, _backend.logits_with_grad(model, tokens))
                (slope,) = torch.autograd.grad(value, a, create_graph=True)
            if slope.requires_grad:  # else the metric is linear along the line: every derivative is 0
                passes.phase = 2
                try:
                    torch.autograd.backward(slope, inputs=[a])
                except RuntimeError as err:
                    if not any(word in str(err).lower() for word in ("derivative", "not implemented", "twice")):
                        raise
                    raise ValueError("the Hessian correction differentiates the backward pass once more, and this "
                                     "model's attention cannot be differentiated twice (a fused kernel, such as a "
                                     "Hugging Face module's scaled-dot-product attention): load it with eager "
                                     f"attention (attn_implementation='eager'). PyTorch says: {err}") from err
    return float(value.detach())


@dataclass(frozen=True)
class Fixed(EdgeEffects):
    """A Hessian-corrected estimate with its unreliable edges patched exactly (:func:`fix_unreliable`).

    Attributes:
        fixed: (sender, receiver) the edges patched exactly.
        screen: the corrected estimate the flags were read from.
        threshold: the reliability below which an edge was patched.

    Example:
        >>> import rs_interp
        >>> model = rs_interp.load_toy_model("induction-1l")
        >>> a, b = rs_interp.induction_batch(2, seed=0).tokens, rs_interp.induction_batch(2, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> screen = rs_interp.edge_attribution_patching(model, a, metric, reference=b, correction="hessian",
        ...                                              per_example=True)
        >>> fixed = rs_interp.fix_unreliable(model, a, metric, screen, reference=b)
        >>> isinstance(fixed, Fixed), len(fixed.fixed_edges()) == int(fixed.fixed.sum())
        (True, True)
    """

    fixed: Bool[torch.Tensor, "sender receiver"] = None  # type: ignore[assignment]
    screen: EdgeEffects | None = None
    threshold: float = 0.5

    def fixed_edges(self) -> list[tuple[str, str]]:
        """The edges patched exactly, row-major."""
        return [e for e, f in zip(self.layout.edges(), self.fixed[self.layout.exists].tolist()) if f]

    def error_bar(self, z: float = 1.959963984540054) -> torch.Tensor:
        """Per edge, the screen's error bar (``z`` standard errors over the pairs), 0 where the edge was
        patched exactly (its number is the effect on these pairs)."""
        return self.screen.error_bar(z).masked_fill(self.fixed, 0.0)


@needs(*EDGE_ESTIMATES, adapts=ONE_PASS_EACH)
def fix_unreliable(model: Model, tokens: torch.Tensor, metric: Metric, scores, *, reference: torch.Tensor,
                   threshold: float = 0.5, screen: str | None = None, memory_budget: int = MEMORY_BUDGET,
                   progress: bool = True):
    """Screen, flag, fix (Zhang & Wang 2026): the edges of a Hessian-corrected estimate whose
    reliability is below ``threshold`` (:meth:`rs_interp.circuits.uncertainty.Spread.reliability`:
    the second-order term outweighs the first, or both vanish) patched exactly
    (:func:`rs_interp.path_patching` on those edges alone), the others kept.

    ``screen="flat"`` (the default for relevance patching's scores, :func:`rs_interp.edge_relevance_patching`,
    which have no second-order term; any edge estimate takes it) flags the *flat* edges instead: the estimate
    vanishes (at most ``FLAT`` of the largest: a saturated softmax, a discretising MLP's plateau, a query or key
    under the AH-rule) while the sender's change does move what the receiver reads (its input after its norm,
    projected by its weights: :func:`moving_edges`): there a first-order number says nothing, and the patch is
    measured instead (``threshold`` unused). ``screen="reliability"`` (the default for a Hessian-corrected
    estimate) is the rule above.

    Returns a :class:`Fixed`: ``effect`` the exact effect on the flagged edges and the corrected
    estimate elsewhere, ``fixed`` which were patched, ``screen`` the estimate it started from. The
    cost: the screen's passes and one exact patch per flagged edge.

    Raises:
        ValueError: ``scores`` not a Hessian-corrected edge estimate of this model, a threshold outside [0, 1].

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
        >>> m = lambda lg: lg[:, -1, 0].mean()
        >>> screen = ri.edge_attribution_patching(model, a, m, reference=b, correction="hessian", per_example=True)
        >>> fixed = fix_unreliable(model, a, m, screen, reference=b)
        >>> exact = ri.path_patching(model, a, m, reference=b)
        >>> all(abs(fixed.edge(*e) - exact.edge(*e)) < 1e-5 for e in fixed.fixed_edges())
        True
    """
    from .path_patching import path_patching
    require(model, "fix_unreliable")
    if screen not in (None, "flat", "reliability"):
        raise ValueError(f"screen must be 'flat', 'reliability' or None (by the estimate), got {screen!r}")
    screen = screen or getattr(type(scores), "default_screen", "reliability")
    if not isinstance(scores, EdgeEffects) or (
            screen == "reliability" and getattr(scores, "first_order", None) is None):
        raise ValueError("fix_unreliable flags by the reliability of a Hessian-corrected estimate, or by the flat "
                         "edges of an estimate (screen='flat', relevance patching's default): pass "
                         "edge_attribution_patching(..., correction='hessian'), or an edge estimate with screen='flat'")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise ValueError(f"threshold must be a number in [0, 1], got {threshold!r}")
    layout = scores.layout
    if screen == "flat":
        return _fix_flat(model, tokens, metric, scores, reference, memory_budget, progress)
    flagged = (scores.reliability() < threshold) & layout.exists
    effect = scores.effect.clone()
    if bool(flagged.any()):
        edges = [e for e, f in zip(layout.edges(), flagged[layout.exists].tolist()) if f]
        exact = path_patching(model, tokens, metric, reference=reference, edges=edges, memory_budget=memory_budget,
                              progress=progress)
        if exact.layout.senders != layout.senders or exact.layout.receivers != layout.receivers:
            raise ValueError("scores must be an estimate of this model's edge graph")
        effect[flagged] = exact.effect[flagged]
    return Fixed(layout=layout, effect=effect, clean=scores.clean, fixed=flagged, screen=scores,
                 threshold=float(threshold))


def _fix_flat(model: Model, tokens: torch.Tensor, metric: Metric, scores, reference: torch.Tensor, memory_budget: int,
              progress: bool):
    """RelP's screen (:func:`fix_unreliable`): its flat edges that move their receiver, patched exactly; one run and
    one reference run shared by the screen and the patches."""
    from .._state import preserve_state
    from ..exact.stream import mlp_flags
    from .path_patching import measure, prepare

    layout = scores.layout
    if layout.receivers != edge_layout(model).receivers:
        raise ValueError("scores must be an estimate of this model's edge graph")
    flat = (scores.effect.abs() <= FLAT * float(scores.effect.nan_to_num(0).abs().max())) & layout.exists
    effect = scores.effect.clone()
    cert = require(model, "path_patching")
    with preserve_state(model, **mlp_flags(model)), torch.no_grad():
        tokens, reference = check_pair(model, tokens, reference)
        run = prepare(model, tokens, reference, metric) if bool(flat.any()) else None
        flagged = moving_edges(model, run, flat) if run is not None else flat
        items = [(i, j, None) for i, j in flagged.nonzero().tolist()]
        measured = measure(model, tokens, metric, run, items, cert, memory_budget, progress) if items else {}
        for (i, j, _), moved in measured.items():
            effect[i, j] = moved
    return Fixed(layout=layout, effect=effect, clean=scores.clean, fixed=flagged, screen=scores, threshold=0.0)


def moving_edges(model: Model, run, candidates: torch.Tensor) -> torch.Tensor:
    """(sender, receiver): which of the ``candidates`` edges move what their receiver reads when patched: the sender's
    exact change ``w_s`` (``run``: :func:`rs_interp.circuits.path_patching.prepare`) moves the receiver's input after
    its norm, projected by its weights (a head's ``N1(x + w_s) W - N1(x) W``, an MLP's by ``W_in``, the logits' by
    ``W_U``), by more than ``FLAT`` of that projection's own size. Where it does not, the receiver computes what it did:
    the edge's exact effect is 0, and a screen need not patch it."""
    out = torch.zeros_like(candidates)
    cfg = model.cfg
    L = cfg.n_layers
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
    layout = edge_layout(model)
    for i, j in candidates.nonzero().tolist():
        c = parse(layout.receivers[j])
        if c.kind == "logits":
            norm, x, M = final_norm_of(model), run.box[N.final_stream(L)], model.W_U.detach()
        elif c.kind == "mlp":
            norm = _backend.pre_norm(model, c.layer, "ln2")
            x = run.box[N.resid_pre(c.layer) if parallel else N.resid_mid(c.layer)]
            M = model.blocks[c.layer].mlp.W_in.detach()
        else:
            n = _backend.kv_groups(cfg) if c.kind == "kv_head" else cfg.n_heads
            norm, x = _backend.pre_norm(model, c.layer, "ln1"), run.box[N.resid_pre(c.layer)]
            M = reader_weight(model, c.layer, f"W_{c.input.upper()}", n)[c.index]
        norm = norm.to(torch.float64)
        x, M = x.to(torch.float64), M.to(torch.float64)
        base = norm.apply(x) @ M
        moved = norm.apply(x + run.delta[i]) @ M - base
        out[i, j] = float(moved.abs().max()) > FLAT * max(float(base.abs().max()), 1e-300)
    return out
