"""Edge attribution patching over the model's whole edge graph (:mod:`rs_interp.edges`).

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
>>> tuple(eap.effect.shape), eap.layout.n_edges, eap.top(1)[0][0].count(" -> ")
((5, 13), 29, 1)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from jaxtyping import Float, Int

from ._backend import TL_MAJOR, Model, attn_weight, kv_groups, per_head_inputs
from ._state import preserve_state
from ._exact import compute_dtype
from .attribution_patching import RESID0, _check_ig_steps, _gradient_passes, _outside_inference_mode, _prepare, _record, _watched
from .edges import EdgeEffects, edge_layout
from .hooks import store_matching
from .metrics import Metric

__all__ = ["EdgeAttributionPatching", "edge_attribution_patching"]


@dataclass(frozen=True)
class EdgeAttributionPatching(EdgeEffects):
    """Edge-level estimates on the model's edge graph (:class:`rs_interp.EdgeEffects`: ``layout``,
    ``effect`` (sender, receiver), NaN where there is no edge, ``clean``, ``.edge(s, r)``, ``.top(k)``).

    Attributes:
        ig_steps: ``m`` of EAP-IG, or None for plain edge attribution patching.

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


def _sender_points(model: Model) -> Callable[[str], bool]:
    mlps = not model.cfg.attn_only
    return lambda n: n == RESID0 or n.endswith("attn.hook_z") or (mlps and n.endswith("hook_mlp_out"))


def _writes(model: Model, ref: dict[str, torch.Tensor], run: dict[str, torch.Tensor]) -> torch.Tensor:
    """(sender, batch, pos, d_model) float64: each sender's ``write_ref - write``, in layout order,
    written into one buffer (the heads' writes by one batched product per layer, no stacking copy)."""
    cfg = model.cfg
    shape = ref[RESID0].shape
    out = torch.empty(1 + cfg.n_layers * (cfg.n_heads + (not cfg.attn_only)), *shape, dtype=torch.float64)
    out[0] = ref[RESID0].to(torch.float64) - run[RESID0].to(torch.float64)
    i = 1
    for l in range(cfg.n_layers):
        z = f"blocks.{l}.attn.hook_z"
        delta = (ref[z] - run[z]).to(torch.float64)  # (batch, pos, head, d_head)
        W_O = model.blocks[l].attn.W_O.detach().to(torch.float64)  # (head, d_head, d_model)
        H = W_O.shape[0]
        torch.bmm(delta.flatten(0, 1).transpose(0, 1), W_O, out=out[i : i + H].view(H, -1, shape[-1]))
        i += H
        if not cfg.attn_only:
            m = f"blocks.{l}.hook_mlp_out"
            out[i] = ref[m].to(torch.float64) - run[m].to(torch.float64)
            i += 1
    return out


def _projection_layers(model: Model) -> set[int]:
    """The layers whose ``hook_{q,k,v}`` hold ``ln1(resid_pre) @ W + b`` per head (KV head): there a
    head's input gradient is its projection's gradient taken back through ``W`` and the LayerNorm
    (frozen statistics, by hand), with no per-head copy of the stream in the forward pass.
    HookedTransformer's attention (3.x) and TransformerLens 4's native attention; not shortformer
    positions (the queries and keys read the stream plus the positions), nor the attention of a
    Hugging Face-booted bridge (whose projection may be followed inside by more, e.g. a query norm):
    those layers take the per-head input hooks."""
    cfg = model.cfg
    if cfg.positional_embedding_type == "shortformer" or getattr(cfg, "ungroup_grouped_query_attention", False):
        return set()
    if TL_MAJOR < 4:
        return set(range(cfg.n_layers))
    from ._backend.tl4 import is_native_attention

    return {l for l in range(cfg.n_layers) if is_native_attention(model, l)}


def _input_gradient(kind: str | None, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The gradient at a LayerNorm's input ``x`` (row, d_model) given the gradient ``dy`` at its
    output (head, row, d_model), one input per head: ``(g - mean(g) - n mean(g n)) / s`` with
    ``g = dy * w``, ``n`` the normalised input, ``s`` its scale (no centring for RMS)."""
    if kind is None:
        return dy
    g = dy * w if kind in ("LN", "RMS") else dy
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    s = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    n = x / s
    dx = g - n * (g * n).mean(-1, keepdim=True)
    if kind in ("LN", "LNPre"):
        dx = dx - g.mean(-1, keepdim=True)
    return dx / s


@_outside_inference_mode
def edge_attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    ig_steps: int | None = None,
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
        ig_steps: ``m`` for EAP-IG (see :func:`rs_interp.attribution_patching`); default plain.
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
    tokens, reference = _prepare(model, tokens, reference)
    steps = _check_ig_steps(ig_steps)
    cfg = model.cfg
    layout = edge_layout(model)
    effect = torch.zeros(len(layout.senders), len(layout.receivers), dtype=torch.float64)
    column = {r: j for j, r in enumerate(layout.receivers)}
    upstream = layout.exists.sum(0).tolist()  # per receiver: its senders are the first `upstream` (depth order)
    flags = {} if cfg.attn_only else dict(use_hook_mlp_in=True)
    grouped = kv_groups(cfg) != cfg.n_heads
    points = _sender_points(model)
    with preserve_state(model, **flags):
        ref = _record(model, reference, points)
        run: dict[str, torch.Tensor] = _record(model, tokens, points) if steps > 1 else {}
        stack: list[torch.Tensor] = []

        def writes() -> torch.Tensor:  # built once, when the first gradient arrives (the forward is over)
            if not stack:
                stack.append(_writes(model, ref, run))
            return stack[0]

        def receiver(labels: list[str], to_input: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Callable:
            """The hook reading the gradient of one hook point; ``to_input`` takes it to the receivers'
            inputs (a projection's gradient back to the per-head inputs) where the point is not one."""
            cols = [column[r] for r in labels]
            k = upstream[cols[0]]

            def fwd(t: torch.Tensor, *, hook) -> torch.Tensor:
                def contract(grad: torch.Tensor) -> None:
                    # The first k senders' writes are a contiguous prefix of the stack: one matrix
                    # product over (batch, pos, d_model) against the gradient, with no copy of them.
                    w = writes()[:k].reshape(k, -1)
                    if to_input is not None:  # (batch * pos * d_model, head): a transposed view, no copy
                        effect[:k, cols] += w @ to_input(grad).to(torch.float64).T
                        return
                    g = grad.to(torch.float64)
                    if g.ndim == 4:  # per-head inputs: (batch, pos, head or kv_head, d_model)
                        effect[:k, cols] += w @ g.transpose(2, 3).reshape(-1, g.shape[2])
                    else:
                        effect[:k, cols[0]] += w @ g.reshape(-1)

                return _watched(t, contract)

            return fwd

        stream: dict[int, torch.Tensor] = {}

        def keep_stream(t: torch.Tensor, *, hook) -> None:
            stream[int(hook.name.split(".")[1])] = t.detach()

        def through_projection(l: int, x: str) -> Callable[[torch.Tensor], torch.Tensor]:
            """hook_{x}'s gradient (batch, pos, head, d_head) -> the per-head inputs', heads first."""
            dt = compute_dtype(model)
            W = attn_weight(model.blocks[l].attn, f"W_{x.upper()}", cfg.n_heads).detach().to(dt)  # (head, d_model, d_head)
            if grouped and x != "q":
                W = W[:: cfg.n_heads // kv_groups(cfg)]  # one per KV head: query head h reads KV head h // group
            ln = None if cfg.normalization_type in (None, "LNPre", "RMSPre") else model.blocks[l].ln1.w.detach().to(dt)

            def to_input(grad: torch.Tensor) -> torch.Tensor:  # -> (head, batch * pos * d_model)
                dy = torch.bmm(grad.to(dt).flatten(0, 1).transpose(0, 1), W.transpose(1, 2))  # (head, batch * pos, d_model)
                x = stream[l].to(dt).flatten(0, 1)
                return _input_gradient(cfg.normalization_type, dy, x, ln, cfg.eps).flatten(1)

            return to_input

        # Plain: the run's sender outputs are read in the pass itself. IG: from a pass of their own
        # (the passes run at interpolated inputs).
        fwd = [] if steps > 1 else store_matching(run, model, points)
        projected = _projection_layers(model)
        for l in range(cfg.n_layers):
            if l in projected:
                fwd.append((f"blocks.{l}.hook_resid_pre", keep_stream))
            for x in "qkv":
                if grouped and x != "q":
                    labels = [f"L{l}KV{g}.{x}" for g in range(kv_groups(cfg))]
                else:
                    labels = [f"L{l}H{h}.{x}" for h in range(cfg.n_heads)]
                if l in projected:
                    fwd.append((f"blocks.{l}.attn.hook_{x}", receiver(labels, through_projection(l, x))))
                else:
                    fwd.append((f"blocks.{l}.hook_{x}_input", receiver(labels)))
            if not cfg.attn_only:
                fwd.append((f"blocks.{l}.hook_mlp_in", receiver([f"MLP{l}"])))
        fwd.append((f"blocks.{cfg.n_layers - 1}.hook_resid_post", receiver(["logits"])))
        # Per-head input hooks (3.x's split inputs, 4.x's emulation) only where a layer reads them.
        split = per_head_inputs(model, fwd) if len(projected) < cfg.n_layers else contextlib.nullcontext(fwd)
        with split as runnable:
            value = _gradient_passes(model, tokens, metric, runnable, steps=steps, x_ref=ref[RESID0], progress=progress)
    effect /= steps
    effect[~layout.exists] = float("nan")
    return EdgeAttributionPatching(layout=layout, effect=effect, clean=value, ig_steps=ig_steps)
