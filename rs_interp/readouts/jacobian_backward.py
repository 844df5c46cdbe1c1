"""The Jacobian lens's backward passes by hand, on blocks whose function the certificate reads off the weights.

Where the certificate vouches that each block is ``resid_mid = x + sum_h A_h (N1(x) W_V^h + b_V^h) W_O^h + b_O`` with
``A_h`` the causal softmax of ``(N1(x) W_Q^h + b_Q^h)(N1(x) W_K^h + b_K^h)^T / scale`` and ``resid_post = resid_mid
+ act(N2(resid_mid) W_in + b_in) W_out + b_out`` (the identities ``stream``, ``heads``, ``values``, ``scores``, ``mlp
reads``, ``mlp writes``, ``mlp weights``; parallel blocks read ``x`` in both), learned positions, no norm after a
sublayer and an elementwise activation, the fit's cotangents are carried back through each block by its derivative
written out (the pattern the model applied, the norms of ``rs_interp.exact.norm``, the activation's derivative at
the run by autograd), a batch of cotangents at once, instead of through autograd's graph. The same derivative, in
fewer operations:

- only the valid positions are carried: a gradient flows from a position to earlier ones only, so what reaches a
  position before ``skip_first`` never returns to a valid one, and the last position receives nothing;
- at the last block the cotangents are the rows of the identity, so their first products with ``W_out`` and ``W_O``
  are those matrices' rows, not matrix products;
- no graph of the forward pass is kept (one pass without gradients records the streams and patterns).

Elsewhere (rotary positions, post-norms, query/key norms, gated MLPs, hooks that move a block's function) the fit
keeps autograd (:func:`rs_interp.fit_jacobian_lens`'s ``backward="autograd"``); both are tested equal to 1e-12 in
float64 (``tests/readouts/test_jacobian_backward.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model, attn_weight
from ..exact.certificate import Certificate
from ..exact.needs import BACKWARD_BY_AUTOGRAD
from ..exact.norm import Norm
from ..exact.stream import record

__all__ = ["by_hand", "prompt_jacobians_by_hand"]

#: The identities that make a block's function its weights' (module docstring): the fit adapts to them
#: (measured with it, :data:`rs_interp.exact.needs.ADAPTS`; autograd where one fails).
IDENTITIES = tuple(BACKWARD_BY_AUTOGRAD)


def by_hand(model: Model, cert: Certificate) -> str | None:
    """Why the blocks' derivative cannot be written out on ``model`` (autograd is used then), or None where it can."""
    cfg = model.cfg
    failed = [n for n in IDENTITIES if not cert.holds(n)]
    reasons = [
        (failed, f"the identities {failed} fail"),
        (cfg.positional_embedding_type != "standard", f"positions {cfg.positional_embedding_type!r}"),
        (_backend.has_post_norms(model), "norms after the sublayers"),
        (_backend.has_qk_norm(model), "query/key norms"),
        (getattr(cfg, "gated_mlp", False), "gated MLPs"),
        (not cfg.attn_only and _activation(cfg) is None, f"the activation {cfg.act_fn!r}"),
        (float(getattr(cfg, "attn_scores_soft_cap", -1.0) or -1.0) > 0, "soft-capped attention scores"),
    ]
    found = [why for bad, why in reasons if bad]
    return "; ".join(found) if found else None


def _activation(cfg):
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    return None if cfg.act_fn in (None, "solu_ln") else SUPPORTED_ACTIVATIONS.get(cfg.act_fn)


@dataclass(frozen=True)
class _Block:
    """What one block's backward reads from the run (positions ``< e``), in the compute dtype."""

    ln1: Norm
    x1: torch.Tensor  # the attention's input stream (batch 1 dropped): (pos, d_model)
    A: torch.Tensor  # (head, query, key)
    q: torch.Tensor  # (pos, head, d_head), per query head
    k: torch.Tensor
    v: torch.Tensor
    W_QKV: torch.Tensor  # (head * 3 * d_head, d_model): the projections' transposes stacked, per query head
    W_O: torch.Tensor  # (d_model, head * d_head)
    scale: float
    mlp: tuple | None  # (N2, its input stream, act'(pre) (pos, d_mlp), W_out^T (d_model, d_mlp), W_in^T) or None
    parallel: bool


def _block(model: Model, layer: int, box: dict, e: int, dt: torch.dtype) -> _Block:
    cfg, H = model.cfg, model.cfg.n_heads
    ln1 = _backend.pre_norm(model, layer, "ln1").to(dt)
    x = box[N.resid_pre(layer)][0, :e].to(dt)
    n1 = ln1.apply(x)
    attn = model.blocks[layer].attn
    W = {w: attn_weight(attn, f"W_{w}", H).detach().to(dt) for w in "QKV"}
    b = {w: attn_weight(attn, f"b_{w}", H).detach().to(dt) for w in "QKV"}
    q, k, v = (torch.einsum("pm,hmd->phd", n1, W[w]) + b[w] for w in "QKV")
    W_QKV = torch.cat([W[w].transpose(1, 2) for w in "QKV"], dim=1).reshape(-1, cfg.d_model)  # (H * 3 dh, d)
    W_O = attn_weight(attn, "W_O", H).detach().to(dt).reshape(-1, cfg.d_model).T.contiguous()  # (d, H dh)
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
    mlp = None
    if not cfg.attn_only:
        ln2 = _backend.pre_norm(model, layer, "ln2").to(dt)
        x2 = x if parallel else box[N.resid_mid(layer)][0, :e].to(dt)
        m = model.blocks[layer].mlp
        W_in, W_out = m.W_in.detach().to(dt), m.W_out.detach().to(dt)
        b_in = m.b_in.detach().to(dt) if getattr(m, "b_in", None) is not None else 0.0
        pre = (ln2.apply(x2) @ W_in + b_in).requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(_activation(cfg)(pre).sum(), pre)  # elementwise: the derivative at the run
        mlp = (ln2, x2, g.detach(), W_out.T.contiguous(), W_in.T.contiguous())
    return _Block(ln1, x, box[N.pattern(layer)][0, :, :e, :e].to(dt), q, k, v, W_QKV, W_O,
                  _backend.attn_scale(model, layer), mlp, parallel)


def _mlp_back(blk: _Block, R: torch.Tensor, s0: int, first: torch.Tensor | None) -> torch.Tensor:
    """The cotangents ``R`` (n, pos, d_model) at the MLP's output carried to its input stream; ``first``: the rows
    of the identity ``R`` holds (the last block), whose product with ``W_out^T`` is read, not computed."""
    ln2, x2, g, W_outT, W_inT = blk.mlp
    da = W_outT[first][:, None, :] if first is not None else R @ W_outT
    return ln2.input_gradient((da * g[s0:]) @ W_inT, x2[s0:])


def _attn_back(blk: _Block, R: torch.Tensor, s0: int, first: torch.Tensor | None) -> torch.Tensor:
    """The cotangents at the attention's output carried to its input stream: through ``W_O``, the pattern (values),
    the softmax and the scores (queries at every valid position against every key before the last; keys and values
    only at valid positions), ``W_Q``, ``W_K``, ``W_V`` and the first norm."""
    n, P, H = R.shape[0], R.shape[1], blk.A.shape[0]
    dh = blk.q.shape[-1]
    gz = (blk.W_O[first][:, None, :].expand(n, P, -1) if first is not None else R @ blk.W_O).reshape(n, P, H, dh)
    A = blk.A[:, s0:]  # (H, P, keys)
    dV = torch.einsum("hts,nthd->nshd", A[:, :, s0:], gz)
    dA = torch.einsum("nthd,shd->nhts", gz, blk.v)
    dS = A * (dA - (dA * A).sum(-1, keepdim=True)) / blk.scale
    dQ = torch.einsum("nhts,shd->nthd", dS, blk.k)
    dK = torch.einsum("nhts,thd->nshd", dS[..., s0:], blk.q[s0:])
    G = torch.cat([dQ, dK, dV], dim=-1).reshape(n, P, -1)  # (n, P, H * 3 dh), as W_QKV's rows
    return blk.ln1.input_gradient(G @ blk.W_QKV, blk.x1[s0:])


def _block_back(blk: _Block, R: torch.Tensor, s0: int, first: torch.Tensor | None) -> torch.Tensor:
    """The cotangents at the block's output carried to its input (the residual passes them on unchanged)."""
    if blk.mlp is None:
        return R + _attn_back(blk, R, s0, first)
    if blk.parallel:
        return R + _attn_back(blk, R, s0, first) + _mlp_back(blk, R, s0, first)
    mid = R + _mlp_back(blk, R, s0, first)
    return mid + _attn_back(blk, mid, s0, None)


def _whole_mlp(blk: _Block, R: torch.Tensor, s0: int, first: bool, positions: int, into: torch.Tensor) -> None:
    """Add ``R K_t`` into ``into`` at each valid position ``t`` for every cotangent at once (``R``: (pos, d_model,
    d_model), a row per cotangent), ``K_t`` the MLP's d_model x d_model Jacobian at ``t`` including its norm:
    ``W_out^T diag(act') W_in^T``, then the norm's derivative applied to its rows, built ``positions`` positions at a
    time. Cheaper than the cotangents through the hidden layer when they are as many as ``d_model`` and
    ``d_mlp > d_model``; ``into`` may be ``R`` itself (each position's rows are read before they are written)."""
    ln2, x2, g, W_outT, W_inT = blk.mlp
    for t0 in range(0, R.shape[0], positions):
        t = slice(t0, min(t0 + positions, R.shape[0]))
        Kt = (W_outT * g[s0:][t][:, None, :]) @ W_inT  # (pc, d, d)
        Kt = ln2.input_gradient(Kt, x2[s0:][t][:, None, :])
        into[t] += Kt if first else torch.bmm(R[t], Kt)


@dataclass(frozen=True)
class _Layers:
    """The blocks run backward, ``start`` to ``L - 1`` (``blocks``), from position ``s0``, in ``dt``; ``where``: the
    row of ``out`` each requested layer fills."""

    blocks: dict[int, _Block]
    L: int
    start: int
    s0: int
    dt: torch.dtype
    where: dict[int, int]


def _whole(run: _Layers, d: int, P: int, batch_size: int, out: torch.Tensor) -> None:
    """Every cotangent at once, (pos, d_model cotangents, d_model), the MLPs by their per-position Jacobians
    (:func:`_whole_mlp`, in place on a sequential block), the attention ``batch_size`` cotangents at a time; ``out``
    filled by layer."""
    blocks, L, start, s0, dt, where = run.blocks, run.L, run.start, run.s0, run.dt, run.where
    R = torch.eye(d, dtype=dt).expand(P, d, d).clone()
    positions = max(1, batch_size // 4)
    for l in range(L - 1, start - 1, -1):
        blk = blocks[l]
        mlp = None
        if blk.mlp is not None:
            mlp = torch.zeros_like(R) if blk.parallel else R  # parallel: the MLP reads the block's input too
            _whole_mlp(blk, R, s0, l == L - 1, positions, mlp)
        for c in range(0, d, batch_size):  # a contiguous copy of the chunk: its products are plain GEMMs
            part = R[:, c: c + batch_size].transpose(0, 1).contiguous()
            R[:, c: c + batch_size] += _attn_back(blk, part, s0, None).transpose(0, 1)
        if mlp is not None and blk.parallel:
            R += mlp
        if l - 1 in where:
            out[where[l - 1]] = R.mean(0)


def whole_fits(d: int, valid: int, dt: torch.dtype, budget: int) -> bool:
    """Whether every cotangent at once (a (valid, d_model, d_model) buffer, and its chunks' transients) fits
    ``budget`` bytes."""
    return 2 * valid * d * d * (torch.finfo(dt).bits // 8) <= budget


def prompt_jacobians_by_hand(model: Model, tokens: torch.Tensor, layers: tuple[int, ...], skip_first: int,
                             batch_size: int, dt: torch.dtype, memory_budget: int) -> torch.Tensor:
    """(layer, d_model, d_model): one prompt's term of the estimator (:mod:`rs_interp.readouts.jacobian_fit`) by
    the blocks' derivative written out (module docstring): every cotangent at once with the MLPs' per-position
    Jacobians where ``memory_budget`` holds them and the model has MLPs wider than the stream, else ``batch_size``
    cotangents at a time through the hidden layers."""
    cfg = model.cfg
    L, d = cfg.n_layers, cfg.d_model
    P = tokens.shape[1]
    s0, e = skip_first, P - 1
    start = min(layers) + 1
    names = {N.resid_pre(l) for l in range(start, L)} | {N.resid_mid(l) for l in range(start, L)}
    names |= {N.pattern(l) for l in range(start, L)}
    box = record(model, tokens, lambda n: n in names)
    blocks = {l: _block(model, l, box, e, dt) for l in range(start, L)}
    out = torch.empty(len(layers), d, d, dtype=dt)
    where = {l: i for i, l in enumerate(layers)}
    wide = not cfg.attn_only and (cfg.d_mlp or 4 * d) > d
    if wide and whole_fits(d, e - s0, dt, memory_budget):
        _whole(_Layers(blocks, L, start, s0, dt, where), d, e - s0, batch_size, out)
        return out
    for s in range(0, d, batch_size):
        rows = torch.arange(s, min(s + batch_size, d))
        R = torch.zeros(len(rows), e - s0, d, dtype=dt)
        R[torch.arange(len(rows)), :, rows] = 1
        for l in range(L - 1, start - 1, -1):
            R = _block_back(blocks[l], R, s0, rows if l == L - 1 else None)
            if l - 1 in where:
                out[where[l - 1], rows] = R.mean(1)
    return out
