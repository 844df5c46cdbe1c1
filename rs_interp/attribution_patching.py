"""Attribution patching: a first-order estimate of every activation patch, from one backward pass.

Patching head ``h``'s ``z`` from a reference run into this run moves a metric by about

    AtP(h) = sum over batch and positions of (z_ref - z) . d metric / d z          (node level)

and patching the *edge* from source head ``s`` into destination head ``d``'s query (key, value)
input, i.e. adding the change of the source's write ``(z_ref - z)_s W_O^s`` to that one input only,
moves it by about

    EAP(s -> d, q) = sum over batch and positions of (z_ref - z)_s W_O^s . d metric / d q_input^d

with ``q_input^d`` the residual stream *before* head ``d``'s LayerNorm (``hook_q_input``). Edges into
each MLP (its input before its LayerNorm) and into the logits (the final stream) are given too.
Both are exact derivatives of the metric along the patch (tested against finite differences to
1e-6 in float64); how well they predict the real patch is a separate question, answered by
comparing with :func:`rs_interp.head_ablation_scan` (attention saturation is the usual failure).

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
from typing import Callable

import torch
from einops import einsum
from jaxtyping import Float, Int
from ._backend import Model, per_head_inputs

from .heads import head_labels
from .hooks import store_matching
from .metrics import Metric, top_effects
from ._state import preserve_state
from ._validate import check_tokens

__all__ = ["AttributionPatching", "EdgeAttributionPatching", "attribution_patching", "edge_attribution_patching"]


@dataclass(frozen=True)
class AttributionPatching:
    """Node-level estimates.

    Attributes:
        effect: (layer, head) the estimated change of the metric when the head's ``z`` is patched
            from the reference run (summed over positions).
        effect_per_position: (layer, head, pos) the same before the sum over positions.
        clean: the metric of the run on ``tokens``.
        labels: ``"L{l}H{h}"`` row-major (:func:`rs_interp.head_labels`).
    """

    effect: Float[torch.Tensor, "layer head"]
    effect_per_position: Float[torch.Tensor, "layer head pos"]
    clean: float
    labels: tuple[str, ...]

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads with the largest estimated ``|effect|``, with their effect."""
        return top_effects(self.labels, self.effect, k)


@dataclass(frozen=True)
class EdgeAttributionPatching:
    """Edge-level estimates.

    Attributes:
        effect: the estimated change of the metric when the edge is patched, by destination:
            ``"q"``, ``"k"``, ``"v"``: (src_layer, src_head, dst_layer, dst_head), NaN where the
            source is not in an earlier layer; ``"mlp"``: (src_layer, src_head, mlp_layer), NaN where
            the source's layer is later than the MLP's (models with MLPs only); ``"logits"``:
            (src_layer, src_head), the edge into the final stream.
        clean: the metric of the run on ``tokens``.
    """

    effect: dict[str, torch.Tensor]
    clean: float

    def edge_labels(self, kind: str) -> tuple[str, ...]:
        """Labels of ``effect[kind]``'s entries, row-major: ``"L0H1 -> L1H0 k"``, ``"L0H1 -> mlp L1"``,
        ``"L0H1 -> logits"``."""
        if kind not in self.effect:
            raise ValueError(f"kind must be one of {tuple(self.effect)}, got {kind!r}")
        shape = self.effect[kind].shape
        src = head_labels(shape[0], shape[1])
        if kind == "logits":
            return tuple(f"{s} -> logits" for s in src)
        if kind == "mlp":
            return tuple(f"{s} -> mlp L{m}" for s in src for m in range(shape[2]))
        dst = head_labels(shape[2], shape[3])
        return tuple(f"{s} -> {d} {kind}" for s in src for d in dst)

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` edges (of every kind) with the largest estimated ``|effect|``, with their effect."""
        labels = [lab for kind in self.effect for lab in self.edge_labels(kind)]
        return top_effects(labels, torch.cat([v.flatten() for v in self.effect.values()]), k)


def _prepare(model: Model, tokens: torch.Tensor, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = check_tokens(model, tokens)
    reference = check_tokens(model, reference, "reference")
    if reference.shape != tokens.shape:
        raise ValueError(f"reference must have the shape of tokens {tuple(tokens.shape)}, got {tuple(reference.shape)}")
    return tokens, reference


def _scalar_metric(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    value = metric(logits)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError("metric must return a scalar tensor (a differentiable function of the logits)")
    if not value.requires_grad:
        raise ValueError("metric must be differentiable in the logits (its result does not require grad)")
    return value.reshape(())


def _watched(t: torch.Tensor, contract: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """A copy of ``t`` that calls ``contract`` with its gradient, to be returned by the hook.

    The copy is what flows on from the hook point, so its gradient is through that reader alone:
    a TransformerLens 4 bridge hands some hooks a tensor that other readers share (the stream
    behind ``hook_mlp_in``), and goes on with its own tensor when a hook returns None or ``t`` itself.
    """
    out = t.clone()
    out.register_hook(contract)
    return out


def _backward(model: Model, tokens: torch.Tensor, metric: Metric, fwd: list) -> float:
    """Forward with ``fwd`` hooks (which register tensor hooks) and a zero leaf at the embedding, then
    backpropagate to that leaf alone: every tensor hook fires, no parameter gets a ``.grad``."""
    leaf = torch.zeros((), dtype=model.cfg.dtype, requires_grad=True)
    fwd = [("hook_embed", lambda t, *, hook: t + leaf)] + fwd
    with torch.enable_grad(), model.hooks(fwd_hooks=fwd):
        value = _scalar_metric(metric, model(tokens, return_type="logits"))
        torch.autograd.backward(value, inputs=[leaf])
    return float(value.detach())


def _reference_z(model: Model, reference: torch.Tensor) -> dict[str, torch.Tensor]:
    box: dict[str, torch.Tensor] = {}
    with torch.no_grad(), model.hooks(fwd_hooks=store_matching(box, model, lambda n: n.endswith("attn.hook_z"))):
        model(reference, return_type=None)
    return box


def attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
) -> AttributionPatching:
    """Node-level attribution patching of every head's ``z`` (module docstring): one forward and one
    backward pass on ``tokens``, plus one forward pass on ``reference``.

    Args:
        metric: a :data:`rs_interp.Metric`, differentiable (e.g. :func:`rs_interp.next_token_loss`).
        reference: tokens of the reference run, the shape of ``tokens``.
    """
    tokens, reference = _prepare(model, tokens, reference)
    L, n_heads, P = model.cfg.n_layers, model.cfg.n_heads, tokens.shape[1]
    per_pos = torch.zeros(L, n_heads, P, dtype=torch.float64)
    with preserve_state(model):
        ref = _reference_z(model, reference)

        def on_z(z: torch.Tensor, *, hook) -> torch.Tensor:
            delta = (ref[hook.name] - z.detach()).to(torch.float64)
            l = int(hook.name.split(".")[1])

            def contract(grad: torch.Tensor) -> None:
                per_pos[l] = einsum(delta, grad.to(torch.float64), "batch pos head_index d_head, batch pos head_index d_head -> head_index pos")

            return _watched(z, contract)

        clean = _backward(model, tokens, metric, [(lambda n: n.endswith("attn.hook_z"), on_z)])
    return AttributionPatching(effect=per_pos.sum(-1), effect_per_position=per_pos, clean=clean, labels=head_labels(L, n_heads))


def edge_attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
) -> EdgeAttributionPatching:
    """Edge attribution patching between every pair of heads (q, k and v inputs), into every MLP and
    into the logits (module docstring), from one forward and one backward pass on ``tokens``.

    The destination inputs are read through TransformerLens's per-head input hooks
    (``use_split_qkv_input`` and ``use_hook_mlp_in`` are switched on for the call and restored; on
    TransformerLens 4's native attention the per-head inputs are emulated, see ``rs_interp._backend``).
    """
    tokens, reference = _prepare(model, tokens, reference)
    cfg = model.cfg
    L, n_heads = cfg.n_layers, cfg.n_heads
    nan = float("nan")
    values = {k: torch.full((L, n_heads, L, n_heads), nan, dtype=torch.float64) for k in "qkv"}
    if not cfg.attn_only:
        values["mlp"] = torch.full((L, n_heads, L), nan, dtype=torch.float64)
    values["logits"] = torch.full((L, n_heads), nan, dtype=torch.float64)
    flags = {} if cfg.attn_only else dict(use_hook_mlp_in=True)
    with preserve_state(model, **flags):
        ref = _reference_z(model, reference)
        delta: dict[int, torch.Tensor] = {}  # per source layer, (batch, pos, head, d_head), float64

        def writes(ls: int) -> torch.Tensor:
            """The change of every layer-``ls`` head's write, (batch, pos, head, d_model)."""
            W_O = model.blocks[ls].attn.W_O.detach().to(torch.float64)
            return einsum(delta[ls], W_O, "batch pos head_index d_head, head_index d_head d_model -> batch pos head_index d_model")

        def on_z(z: torch.Tensor, *, hook) -> None:
            delta[int(hook.name.split(".")[1])] = (ref[hook.name] - z.detach()).to(torch.float64)

        def on_input(kind: str, layer: int, upto: int) -> Callable:
            def fwd(t: torch.Tensor, *, hook) -> torch.Tensor:
                def contract(grad: torch.Tensor) -> None:
                    g = grad.to(torch.float64)
                    for ls in range(upto):
                        if kind in "qkv":  # grad: (batch, pos, dst_head, d_model)
                            values[kind][ls, :, layer, :] = torch.einsum("bpsm,bphm->sh", writes(ls), g)
                        elif kind == "mlp":  # grad: (batch, pos, d_model)
                            values["mlp"][ls, :, layer] = torch.einsum("bpsm,bpm->s", writes(ls), g)
                        else:
                            values["logits"][ls] = torch.einsum("bpsm,bpm->s", writes(ls), g)

                return _watched(t, contract)

            return fwd

        fwd = [(lambda n: n.endswith("attn.hook_z"), on_z)]
        for l in range(L):
            fwd += [(f"blocks.{l}.hook_{k}_input", on_input(k, l, l)) for k in "qkv"]
            if not cfg.attn_only:
                fwd.append((f"blocks.{l}.hook_mlp_in", on_input("mlp", l, l + 1)))
        fwd.append((f"blocks.{L - 1}.hook_resid_post", on_input("logits", L, L)))
        with per_head_inputs(model, fwd) as runnable:
            clean = _backward(model, tokens, metric, runnable)
    return EdgeAttributionPatching(effect=values, clean=clean)
