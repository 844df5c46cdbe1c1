"""The logit lens: read the residual stream through the unembedding between layers.

At each reading point (after the embedding, after every block, optionally after every attention
sublayer too) the stream ``x`` is decoded as the model decodes its final stream:
``softmax(softcap(LN_final(x) W_U + b_U))``, the final norm's scale recomputed from ``x`` itself (no
norm, no soft-cap where the model has none; the certificate's ``readout`` checks that this is the
model's own readout). For the toy models, which have no final LayerNorm, the lens
is the model's own readout; elsewhere it is a heuristic (the tuned lens refines it).

Memory stays bounded: sequences go through the model as many at a time as ``memory_budget``
allows (or ``batch_chunk`` at a time, if given) and rows are decoded ``row_chunk`` at a time, so
``(point, batch, pos, d_vocab)`` is never held unless the caller asks for ``full=True``.

>>> from rs_interp import load_toy_model, induction_batch
>>> b = induction_batch(4, seed=0)
>>> lens = logit_lens(load_toy_model(), b.tokens, targets=b.targets)
>>> lens.labels, tuple(lens.target_probs.shape)
(('embed', 'L0', 'L1'), (3, 4, 48))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int

from .. import _names as N
from .._backend import Model, logit_softcap, run_from
from .._budget import MEMORY_BUDGET
from .._keywords import renamed
from .._state import preserve_state
from ..exact.certificate import Certificate, require
from ..exact.needs import LENS_ONE_PASS, needs
from ..exact.readout import compute_dtype, d_vocab_out, final_norm_of, unembed_bias
from ..exact.validate import check_int_range, check_targets, check_tokens
from ..hooks import store
from ..labels import lens_label

__all__ = ["LogitLensReadings", "logit_lens", "reading_points"]


@dataclass(frozen=True)
class LogitLensReadings:
    """What the logit lens read at every reading point (the lens itself is :func:`logit_lens`).

    Attributes:
        labels: reading points, ``"embed"``, ``"L0"`` (after block 0), ``"L0 attn"`` (after block
            0's attention, with ``sublayers=True``), ...
        target_probs: (point, batch, pos) probability of ``targets`` (NaN where a target is -1),
            or None without targets.
        top_tokens: (point, batch, pos, k) most probable token ids.
        top_probs: (point, batch, pos, k) their probabilities.
        entropy: (point, batch, pos) entropy in nats.
        log_probs: (point, batch, pos, d_vocab) full log-distributions, only with ``full=True``.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> lens = rs_interp.logit_lens(model, a, targets=b)
        >>> len(lens.labels) == lens.entropy.shape[0]
        True
    """

    labels: tuple[str, ...]
    target_probs: torch.Tensor | None
    top_tokens: torch.Tensor
    top_probs: torch.Tensor
    entropy: torch.Tensor
    log_probs: torch.Tensor | None = None


def reading_points(model: Model, sublayers: bool = False) -> list[tuple[str, str]]:
    """(label, hook name) of every reading point, in order (:func:`rs_interp.labels.lens_label`)."""
    points = [(lens_label(None), N.RESID0)]
    for l in range(model.cfg.n_layers):
        if sublayers and not model.cfg.attn_only:
            points.append((lens_label(l, sublayer="attn"), N.resid_mid(l)))
        points.append((lens_label(l), N.resid_post(l)))
    return points


def _read_tiled(x: torch.Tensor, W_U: torch.Tensor, b_U: torch.Tensor | None, top_k: int, targets: torch.Tensor | None,
                tile: int, cap: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-k probabilities and tokens, entropy and target probabilities of ``softmax(x W_U + b_U)``,
    reading the vocabulary ``tile`` columns at a time (online softmax).

    Per row a running maximum ``m``, ``s = sum exp(l - m)`` and ``d = sum exp(l - m) l`` are kept
    and rescaled when ``m`` grows; then ``log Z = m + log s`` and the entropy is ``log Z - d / s``.
    Each tile's logits are used while they are in cache: every logit is written once by the matmul
    and read a few times from cache, never from memory. Top-k merges each tile's top-k, whose first
    (sorted) value is also the tile's maximum: no separate pass over the tile finds ``m``.
    """
    R, V = x.shape[0], W_U.shape[1]
    dt = x.dtype
    m = torch.full((R, 1), float("-inf"), dtype=dt)
    s = torch.zeros(R, 1, dtype=dt)
    d = torch.zeros(R, 1, dtype=dt)
    top_v = torch.empty(R, 0, dtype=dt)
    top_i = torch.empty(R, 0, dtype=torch.long)
    buf = torch.empty(R, min(tile, V), dtype=dt)
    for c0 in range(0, V, tile):
        c1 = min(c0 + tile, V)
        logits = torch.addmm(b_U[c0:c1], x, W_U[:, c0:c1]) if b_U is not None else x @ W_U[:, c0:c1]
        if cap is not None:  # the model's final soft-cap, elementwise
            logits = cap * torch.tanh(logits / cap)
        v, i = logits.topk(min(top_k, c1 - c0), dim=-1)  # sorted: v[:, :1] is the tile's maximum
        m_new = torch.maximum(m, v[:, :1])
        e = torch.sub(logits, m_new, out=buf[:, : c1 - c0]).exp_()
        rescale = (m - m_new).exp_()
        s = s * rescale + e.sum(-1, keepdim=True)
        d = d * rescale + (e.unsqueeze(-2) @ logits.unsqueeze(-1))[..., 0]  # sum e * logits, no temporary
        m = m_new
        top_v, top_i = torch.cat([top_v, v], -1), torch.cat([top_i, i + c0], -1)
        if top_v.shape[1] > top_k:
            top_v, keep = top_v.topk(top_k, dim=-1)
            top_i = top_i.gather(-1, keep)
    log_z = m + s.log()
    entropy = (log_z - d / s)[:, 0]
    target = None
    if targets is not None:
        t = targets.clamp(min=0)
        logit_t = (x * W_U[:, t].T).sum(-1) + (b_U[t] if b_U is not None else 0)
        if cap is not None:
            logit_t = cap * torch.tanh(logit_t / cap)
        target = (logit_t - log_z[:, 0]).exp()
    return (top_v - log_z).exp(), top_i, entropy, target


def _batch_chunk(model: Model, P: int, n_points: int, memory_budget: int) -> int:
    """Sequences per forward pass within ``memory_budget`` bytes: per sequence, the stream at every
    reading point plus a block's transients (a few streams, the MLP's hidden layer twice, the
    attention scores and pattern); at least one."""
    cfg = model.cfg
    elem = torch.finfo(compute_dtype(model)).bits // 8
    d_mlp = 0 if cfg.attn_only else (cfg.d_mlp or 4 * cfg.d_model)
    per_seq = elem * (P * ((n_points + 4) * cfg.d_model + 2 * d_mlp) + 2 * cfg.n_heads * P * P)
    return max(1, memory_budget // per_seq)


@needs("readout", "stop at layer", "vocabulary", adapts=LENS_ONE_PASS)
@renamed(top_k="k")
def logit_lens(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    targets: Int[torch.Tensor, "batch pos"] | None = None,
    k: int = 5,
    sublayers: bool = False,
    full: bool = False,
    batch_chunk: int | None = None,
    row_chunk: int = 1024,
    vocab_tile: int = 4096,
    memory_budget: int = MEMORY_BUDGET,
) -> LogitLensReadings:
    """Decode the residual stream at every reading point (see the module docstring).

    Args:
        model: any ``Model``.
        tokens: (batch, pos) token ids.
        targets: optional (batch, pos) token ids whose probability to report; -1 marks a
            position to skip (its probability is NaN), e.g. the last position for next tokens.
        k: how many top tokens to keep per reading (as ``.top(k)``).
        sublayers: also read after each attention sublayer (models with MLPs).
        full: also return every full log-distribution (memory: point x batch x pos x d_vocab).
        batch_chunk, row_chunk: sequences per forward pass (default: as many as ``memory_budget``
            allows), rows per decoding step.
        vocab_tile: vocabulary columns decoded at a time (the working set of a decoding step is
            ``row_chunk x vocab_tile``: sized to stay in cache).
        memory_budget: bytes for one forward pass's activations (every reading point's stream,
            the MLP's hidden layer, the attention scores) when ``batch_chunk`` is not given.

    The last reading point equals the model's own output distribution.

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> lens = logit_lens(model, a, targets=b, k=3)
        >>> lens.labels[0], tuple(lens.top_tokens.shape)[-1]
        ('embed', 3)
    """
    tokens = check_tokens(model, tokens)
    cert = require(model, "logit_lens")
    return read_points(model, tokens, reading_points(model, sublayers), None, cert, targets=targets, k=k, full=full,
                       batch_chunk=batch_chunk, row_chunk=row_chunk, vocab_tile=vocab_tile, memory_budget=memory_budget)


def read_points(
    model: Model,
    tokens: torch.Tensor,
    points: list[tuple[str, str]],
    transports: dict[str, torch.Tensor] | None,
    cert: Certificate,
    *,
    targets: torch.Tensor | None,
    k: int,
    full: bool,
    batch_chunk: int | None,
    row_chunk: int,
    vocab_tile: int,
    memory_budget: int,
) -> LogitLensReadings:
    """The lenses' one decoding: the stream at each reading point ``(label, hook name)``, first multiplied by
    ``transports[hook name]`` (``x J^T``: the Jacobian lens's matrix, in the compute dtype) where given, read
    as the model reads its final stream (:func:`logit_lens`; ``cert`` the model's certificate)."""
    cap = logit_softcap(model)
    V = d_vocab_out(model)
    check_int_range("k", k, 1, V)
    check_int_range("memory_budget", memory_budget, 1)
    if batch_chunk is None:
        batch_chunk = _batch_chunk(model, tokens.shape[1], len(points), memory_budget)
    check_int_range("batch_chunk", batch_chunk, 1)
    if not cert.holds("rows"):  # a row's logits depend on its batch: read the batch in one pass, as the model runs it
        batch_chunk = tokens.shape[0]
    check_int_range("row_chunk", row_chunk, 1)
    check_int_range("vocab_tile", vocab_tile, 1)
    if targets is not None:
        targets = check_targets(targets, tokens, V)  # -1: skip (NaN probability)
    B, P = tokens.shape
    n_pts = len(points)
    dt = compute_dtype(model)  # float32 for half-precision models: softmax and entropy need the range
    top_tokens = torch.empty(n_pts, B, P, k, dtype=torch.long)
    top_probs = torch.empty(n_pts, B, P, k, dtype=dt)
    entropy = torch.empty(n_pts, B, P, dtype=dt)
    target_probs = None if targets is None else torch.full((n_pts, B, P), float("nan"), dtype=dt)
    log_probs = torch.empty(n_pts, B, P, V, dtype=dt) if full else None
    names = {name for _, name in points}
    moved = {name: J.to(dt) for name, J in (transports or {}).items()}

    def stream(x: torch.Tensor, name: str) -> torch.Tensor:
        x = x.to(dt)
        return x if name not in moved else x @ moved[name].T

    with preserve_state(model), torch.no_grad():
        W_U = model.W_U.detach().to(dt)
        b_U = unembed_bias(model, dt)
        has_bias = b_U is not None and bool(b_U.any())
        norm = final_norm_of(model).to(dt)
        for b0 in range(0, B, batch_chunk):
            box: dict[str, torch.Tensor] = {}
            with model.hooks(fwd_hooks=[(n, store(box, n)) for n in names]):
                # up to the last block only: the lens does its own unembedding, tile by tile
                run_from(model, tokens[b0 : b0 + batch_chunk], stop=model.cfg.n_layers)
            # Every reading point's rows decoded together: on short inputs one point alone is too
            # few rows to pay for reading W_U (the decoding is bound by memory below ~100 rows).
            nb = box[points[0][1]].shape[0]
            flat = torch.cat([norm.apply(stream(box.pop(name).reshape(nb * P, -1), name)) for _, name in points])
            n = nb * P  # rows per reading point
            for r0 in range(0, flat.shape[0], row_chunk):
                rows = torch.arange(r0, min(r0 + row_chunk, flat.shape[0]))
                ii, bi = rows // n, rows % n  # reading point; row within it
                bb, pp = b0 + bi // P, bi % P
                x = flat[r0 : r0 + row_chunk]
                t = None if targets is None else targets[bb, pp]
                if log_probs is None:
                    tp, tt, ent, tgt = _read_tiled(x, W_U, b_U if has_bias else None, k, t, vocab_tile, cap)
                else:
                    lp = torch.addmm(b_U, x, W_U) if has_bias else x @ W_U
                    lp = (lp if cap is None else cap * torch.tanh(lp / cap)).log_softmax(-1)
                    log_probs[ii, bb, pp] = lp.cpu()
                    (tp, tt), ent = lp.topk(k, dim=-1), -(lp.exp() * lp).sum(-1)
                    tp = tp.exp()
                    tgt = None if t is None else lp.gather(-1, t.clamp(min=0)[:, None])[:, 0].exp()
                top_probs[ii, bb, pp], top_tokens[ii, bb, pp] = tp.cpu(), tt.cpu()
                entropy[ii, bb, pp] = ent.cpu()
                if tgt is not None:
                    ok = (t >= 0).cpu()
                    target_probs[ii[ok], bb[ok], pp[ok]] = tgt.cpu()[ok]

    return LogitLensReadings(labels=tuple(l for l, _ in points), target_probs=target_probs, top_tokens=top_tokens,
                             top_probs=top_probs, entropy=entropy, log_probs=log_probs)
