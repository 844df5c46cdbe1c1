"""Relevance patching's rules (:mod:`rs_interp.circuits.relevance`), swept backwards by hand through the layers of one
recorded run, every coefficient held at its value there: the norms' scales (LN-rule), the attention patterns (AH-rule),
an MLP activation's ratio ``act(h) / h`` (identity rule), half the gradient through a gated product (half rule)."""

from __future__ import annotations

from typing import Callable

import torch

from .. import _backend
from .. import _names as N
from .._backend import GATED_B_IN_AFTER_PRODUCT, Model, kv_groups, logit_softcap
from ..exact.postnorm import attn_post, raw_output
from ..exact.readout import final_norm_of
from ..exact.stream import RESID0, reader_weight
from ..hooks import store_matching
from ..metrics import Metric
from ._substrate import scalar_metric

__all__ = ["sweep", "run_points", "recorded_gradient"]


def _activation(model: Model) -> Callable[[torch.Tensor], torch.Tensor]:
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    act = model.cfg.act_fn
    if act in (None, "solu_ln") or act not in SUPPORTED_ACTIVATIONS:
        raise ValueError(f"relevance patching's identity rule needs the MLP activation by hand; {act!r} has none here "
                         "(solu_ln has a norm inside)")
    return SUPPORTED_ACTIVATIONS[act]


def _ratio(out: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The identity rule's coefficient ``act(h) / h``, 0 where ``h = 0``."""
    safe = torch.where(h == 0, torch.ones_like(h), h)
    return torch.where(h == 0, torch.zeros_like(h), out / safe)


def _weights(model: Model, layer: int, dt: torch.dtype) -> dict[str, torch.Tensor | float]:
    mlp = model.blocks[layer].mlp
    names = ("W_in", "b_in", "W_out", "b_out", "W_gate")
    return {n: (p.detach().to(dt) if (p := getattr(mlp, n, None)) is not None else 0.0) for n in names}


def _mlp_back(model: Model, layer: int, box: dict, R: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """The MLP's input coefficient (batch, pos, d_model, before its norm) from ``R`` at what it adds to the stream."""
    parallel = bool(getattr(model.cfg, "parallel_attn_mlp", False))
    x = box[N.resid_pre(layer) if parallel else N.resid_mid(layer)].to(dt)
    ln2 = _backend.pre_norm(model, layer, "ln2").to(dt)
    u, w, act = ln2.apply(x), _weights(model, layer, dt), _activation(model)
    if getattr(model.cfg, "gated_mlp", False):
        g = u @ w["W_gate"]
        a = act(g)
        lin = u @ w["W_in"] + (0.0 if GATED_B_IN_AFTER_PRODUCT else w["b_in"])
        hidden = a * lin + (w["b_in"] if GATED_B_IN_AFTER_PRODUCT else 0.0)
    else:
        h = u @ w["W_in"] + w["b_in"]
        hidden = act(h)
    post = _backend.post_norms(model, layer)[1].to(dt)
    dy = R if post.kind is None else post.readout(R, post.scale(hidden @ w["W_out"] + w["b_out"]))
    d_hidden = dy @ w["W_out"].T
    if getattr(model.cfg, "gated_mlp", False):  # the half rule, the identity rule on the gate's activation
        du = 0.5 * ((d_hidden * lin * _ratio(a, g)) @ w["W_gate"].T + (d_hidden * a) @ w["W_in"].T)
    else:
        du = (d_hidden * _ratio(hidden, h)) @ w["W_in"].T
    return ln2.readout(du, ln2.scale(x))


def _attn_back(model: Model, layer: int, box: dict, R: torch.Tensor, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
    """From ``R`` at what the attention adds to the stream: the coefficients at ``z`` (batch, pos, head, d_head),
    at ``v`` (batch, pos, n, d_head) and at each value reader's input (n, batch, pos, d_model), ``n`` the heads (KV
    heads under grouped-query attention); the pattern held (the AH-rule), so nothing reaches ``q`` or ``k``."""
    cfg = model.cfg
    post = attn_post(model, layer, dt)
    dr = R if post.kind is None else post.readout(R, post.scale(raw_output(model, layer, box[N.z(layer)], dt)))
    dz = torch.einsum("bpm,hdm->bphd", dr, model.blocks[layer].attn.W_O.detach().to(dt))
    A = box[N.pattern(layer)].to(dt)  # (batch, head, query, key)
    dv = torch.einsum("bhqk,bqhd->bkhd", A, dz)
    n = kv_groups(cfg) if kv_groups(cfg) != cfg.n_heads else cfg.n_heads
    dv = dv.reshape(*dv.shape[:2], n, cfg.n_heads // n, dv.shape[-1]).sum(3)  # query head h reads KV head h // group
    du = torch.einsum("bpnd,nmd->nbpm", dv, reader_weight(model, layer, "W_V", n, dt))
    ln1 = _backend.pre_norm(model, layer, "ln1").to(dt)
    return dz, dv, ln1.readout(du, ln1.scale(box[N.resid_pre(layer)].to(dt)))


def sweep(model: Model, box: dict, g: torch.Tensor, dt: torch.dtype,
          emit: Callable[[int, str, torch.Tensor], None]) -> None:
    """The relevance coefficients, last layer first: ``emit(layer, kind, t)`` with ``kind`` ``"logits"``, ``"mlp"``
    (column, batch, pos, d_model), ``"v"`` (the value readers', same), ``"z"`` and ``"dv"`` (at the heads' outputs and
    values), and ``"stream"`` (at the stream entering each layer, (batch, pos, d_model)). ``box``: the run's streams,
    patterns and ``z``; ``g``: the metric's gradient at the logits before any soft-cap."""
    cfg = model.cfg
    L = cfg.n_layers
    final = box[N.final_stream(L)].to(dt)
    norm = final_norm_of(model).to(dt)
    R = norm.readout(g.to(dt) @ model.W_U.detach().to(dt).T, norm.scale(final))
    emit(L - 1, "logits", R[None])
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
    for l in reversed(range(L)):
        R_mlp = None
        if not cfg.attn_only:
            R_mlp = _mlp_back(model, l, box, R, dt)
            emit(l, "mlp", R_mlp[None])
        R_attn = R if (parallel or R_mlp is None) else R + R_mlp
        dz, dv, Rv = _attn_back(model, l, box, R_attn, dt)
        emit(l, "z", dz)
        emit(l, "dv", dv)
        emit(l, "v", Rv)
        R = R_attn + Rv.sum(0) + (R_mlp if parallel and R_mlp is not None else 0.0)
        emit(l, "stream", R)


def run_points(model: Model) -> set[str]:
    """What :func:`sweep` reads from the run: each layer's stream in and its middle, pattern and ``z``, the final
    stream."""
    L = model.cfg.n_layers
    names = {N.resid_pre(l) for l in range(L)} | {N.pattern(l) for l in range(L)} | {N.z(l) for l in range(L)}
    names |= {N.resid_mid(l) for l in range(L)} if not model.cfg.attn_only else set()
    return names | {N.final_stream(L)}


def recorded_gradient(model: Model, tokens: torch.Tensor, metric: Metric, names, *,
                      line: tuple[float, torch.Tensor] | None = None) -> tuple[dict, float, torch.Tensor]:
    """One no-grad run storing the activations at ``names`` (a set or a predicate), the metric on its
    logits and its gradient there (before any soft-cap: the cap's derivative applied). ``line = (alpha, x_ref)``:
    the run whose stream entering block 0 is ``x_ref + alpha (x - x_ref)`` (an integrated-gradients point)."""
    box: dict[str, torch.Tensor] = {}
    wanted = names if callable(names) else (lambda n: n in names)
    fwd = store_matching(box, model, wanted)
    if line is not None:
        alpha, x_ref = line
        fwd = [(RESID0, lambda t, *, hook: x_ref.to(t.dtype) + alpha * (t - x_ref.to(t.dtype)))] + fwd
    with torch.no_grad(), model.hooks(fwd_hooks=fwd):
        logits = model(tokens, return_type="logits")
    with torch.enable_grad():
        leaf = logits.detach().requires_grad_(True)
        value = scalar_metric(metric, leaf)
        (g,) = torch.autograd.grad(value, leaf)
    cap = logit_softcap(model)
    if cap is not None:  # d/dl of cap tanh(l / cap): 1 - (capped / cap)^2
        g = g * (1 - (logits.detach() / cap) ** 2)
    return box, float(value.detach()), g
