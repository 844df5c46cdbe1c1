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
line from the reference's input embedding to the run's (see :func:`rs_interp.attribution_patching`).

>>> from rs_interp import load_toy_model, induction_batch
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
>>> eap = edge_attribution_patching(model, a, lambda logits: logits[:, -1, 0].mean(), reference=b)
>>> tuple(eap.effect.shape), eap.layout.n_edges, len(eap.top(1)[0][0])   # an edge: (sender, receiver)
((5, 13), 29, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int

from .._backend import Model
from .._state import preserve_state
from .._stream import RESID0, Reader, mlp_flags, reader_gradients, readers
from ..certificate import require
from ..hooks import store_matching
from ..metrics import Metric
from ._substrate import IGRule, check_pair, gradient_passes, ig_alphas, outside_inference_mode, record, sender_points, writes
from .graph import EdgeEffects, edge_layout

__all__ = ["EdgeAttributionPatching", "edge_attribution_patching"]


@dataclass(frozen=True)
class EdgeAttributionPatching(EdgeEffects):
    """Edge-level estimates on the model's edge graph (:class:`rs_interp.EdgeEffects`: ``layout``,
    ``effect`` (sender, receiver), NaN where there is no edge, ``clean``, ``.edge(s, r)``, ``.top(k)``).

    Attributes:
        ig_steps, ig_rule: ``m`` of EAP-IG and its rule, or None for plain edge attribution patching.

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


@outside_inference_mode
def edge_attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    ig_steps: int | None = None,
    ig_rule: IGRule = "left",
    progress: bool = False,
) -> EdgeAttributionPatching:
    """Edge attribution patching of every edge of the model's graph (module docstring), from one
    forward and one backward pass on ``tokens`` (``m`` of each with ``ig_steps=m``) plus one forward
    pass on ``reference``.

    A head's q, k or v input gradient is read at ``hook_{q,k,v}`` (the per-head projection) and
    taken back through ``W_{Q,K,V}`` and the frozen LayerNorm by hand, on HookedTransformer's
    attention and TransformerLens 4's native attention: the forward pass stays the model's own, with
    no per-head copy of the stream. Elsewhere (shortformer positions, a Hugging Face-booted bridge's
    attention) TransformerLens's per-head input hooks are used (``use_split_qkv_input`` switched on
    for the call and restored). ``use_hook_mlp_in`` is switched on for the MLPs' inputs and restored.

    Args:
        metric: a :data:`rs_interp.Metric`, differentiable.
        reference: tokens of the reference run, the shape of ``tokens``.
        ig_steps, ig_rule: ``m`` for EAP-IG and which ``m`` points (see :func:`rs_interp.attribution_patching`);
            default plain.
        progress: a progress bar over the ``m`` passes.

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = edge_attribution_patching(model, a, metric, reference=b, ig_steps=3)
        >>> eap.layout.n_edges, eap.ig_steps, int(eap.effect.isnan().sum())
        (29, 3, 36)
    """
    tokens, reference = check_pair(model, tokens, reference)
    alphas = ig_alphas(ig_steps, ig_rule)
    require(model, "edge_attribution_patching")
    layout = edge_layout(model)
    effect = torch.zeros(len(layout.senders), len(layout.receivers), dtype=torch.float64)
    column = {r: j for j, r in enumerate(layout.receivers)}
    upstream = layout.exists.sum(0).tolist()  # per receiver: its senders are the first `upstream` (depth order)
    points = sender_points(model)
    with preserve_state(model, **mlp_flags(model)):
        ref = record(model, reference, points)
        run: dict[str, torch.Tensor] = record(model, tokens, points) if alphas != [1.0] else {}
        stack: list[torch.Tensor] = []

        def on_grad(reader: Reader, G: torch.Tensor) -> None:
            # The senders upstream of a receiver are a contiguous prefix of the writes: one matrix
            # product over (batch, pos, d_model) against the gradient, with no copy of them.
            if not stack:  # built once, when the first gradient arrives (the forward is over)
                stack.append(writes(model, ref, run))
            cols = [column[r] for r in reader.labels]
            k = upstream[cols[0]]
            effect[:k, cols] += stack[0][:k].reshape(k, -1) @ G

        # Plain: the run's sender outputs are read in the pass itself. IG: from a pass of their own
        # (the passes run at interpolated inputs).
        fwd = [] if alphas != [1.0] else store_matching(run, model, points)
        with reader_gradients(model, readers(model), on_grad) as hooks:
            value = gradient_passes(model, tokens, metric, fwd + hooks, alphas=alphas, x_ref=ref[RESID0], progress=progress)
    effect /= len(alphas)
    effect[~layout.exists] = float("nan")
    return EdgeAttributionPatching(layout=layout, effect=effect, clean=value, ig_steps=ig_steps, ig_rule=ig_rule)
