"""AtP* (Kramar, Lieberum, Shah & Nanda 2024): the QK fix and GradDrop, options of the node and
edge estimates (``qk_fix=True``, ``grad_drop=True``).

**The QK fix.** Attribution patching linearises a query or key patch through the attention softmax,
whose gradient vanishes where it saturates. The QK fix recomputes the softmax with the patched scores
and linearises after it only: for head ``h`` whose query or key input is patched,

    QK(n) = sum over batch, query, key of (A'_h - A_h) dm/dA_h = sum over batch, pos of (z'_h - z_h) . dm/dz_h

(equal sums: ``z = A v``, and ``v`` does not move when a query or key does), where ``A'_h`` and
``z'_h`` are the head's pattern and output with the patch, computed by the model's own attention
(rotary, grouped-query, soft-caps and all): one forward pass from the receiver's layer up to its
``hook_z``, the patched copies stacked along the batch, every sender of a layer in one pass where the
memory budget allows. Nodes: a head's ``hook_q`` (or ``hook_k``) set to the reference run's. Edges:
``w_s`` added to the receiver's input (a key/value head's patch moves every query head that reads it).
Where a query or key norm spans the heads (OLMo-2, OLMoE), each node's ``hook_q`` (before the norm) is patched on
a copy of its own, so no other head's patch reaches its normalised query through the norm; an edge moves every
head's input on one copy, which the per-head inputs normalise per head (``rs_interp._backend.head_copies``):
head ``h``'s query is ``slice_h(q_norm((x + w_s) W_Q))``, the receiver's definition.
Exact where the metric is linear in the head's output (tested to 1e-9 against exact patching).

**GradDrop.** A node whose direct and indirect effects cancel gets a gradient near 0. GradDrop runs
the backward pass once more per layer ``l = 1 .. L - 1``, each time with the gradient from layer ``l``'s
readers into the stream set to 0 (layer ``l``'s components and everything after them keep their
gradient; the paths through layer ``l`` are cut for everything before it), and scores

    GradDrop(n) = (1 / max(L - 1, 1)) sum_{l = 0}^{L - 1} |AtP_{-l}(n)|

where ``AtP_{-0} = AtP`` (nothing reads the stream below layer 0): ``L`` backward passes in all (a
one-layer model has nothing to drop, and GradDrop is ``|AtP|``). With
the QK fix, each pass's ``dm/dz`` enters the fix. A magnitude, for ranking: it has no sign and no
per-pair shares.

>>> from rs_interp import load_toy_model, induction_batch, edge_attribution_patching
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
>>> star = edge_attribution_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b, qk_fix=True, grad_drop=True)
>>> star.qk_fix, star.grad_drop, bool((star.effect.nan_to_num(0) >= 0).all())
(True, True, True)
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model, Stop, per_query_head, run_from
from .._progress import bar
from ..exact.certificate import Certificate
from ..exact.stream import reader_weight, readers, routed, stacked_start, watched
from ..labels import parse
from .correction import Passes
from .graph import EdgeLayout

__all__ = ["drop_hooks", "dropped", "z_gradients", "combine_drops", "node_qk_deltas", "edge_qk_fix",
           "check_drop_layers"]


def check_drop_layers(model: Model) -> list[int]:
    """The layers GradDrop drops, ``1 .. L - 1`` (none on a one-layer model)."""
    return list(range(1, model.cfg.n_layers))


def _severed(t: torch.Tensor, *, hook) -> torch.Tensor:
    out = t.clone()
    out.register_hook(torch.zeros_like)  # what reads this point keeps its gradient; nothing flows on upstream
    return out


def drop_hooks(model: Model, layer: int | None, *, projected: bool = True) -> list[tuple[str, Callable]]:
    """Hooks that set the gradient from layer ``layer``'s readers (its heads' query, key and value
    inputs and its MLP's input) into the stream to 0; none for ``None``. To be placed ahead of any
    other hook at those points (:func:`rs_interp.exact.stream.reader_gradients`' ``extra``)."""
    if layer is None:
        return []
    return [(r.hook, _severed) for r in readers(model, projected=projected) if r.layer == layer and r.kind != "logits"]


@contextlib.contextmanager
def dropped(model: Model, layer: int | None, fwd: list) -> Iterator[list]:
    """``fwd`` with :func:`drop_hooks` of ``layer`` ahead, routed through the per-head inputs where a
    reader is read split."""
    drops = drop_hooks(model, layer)
    with routed(model, drops + fwd, split=any("_input" in name for name, _ in drops)) as runnable:
        yield runnable


def z_gradients(grads_z: list[dict[int, torch.Tensor]], passes: Passes) -> list[tuple[Callable, Callable]]:
    """The hook keeping ``dm/dz`` per layer (what the QK fix contracts) in ``grads_z[round]`` (one dict per
    GradDrop round, ``passes.drop``), from the first-order backward pass (``passes.phase == 1``)."""

    def on_z(z: torch.Tensor, *, hook) -> torch.Tensor:
        def keep(grad: torch.Tensor, layer: int = N.layer_of(hook.name)) -> None:
            if passes.phase == 1:
                grads_z[passes.drop][layer] = grad.detach().to(torch.float64)
        return watched(z, keep)

    return [(N.every(N.z), on_z)]


def combine_drops(estimates: list[torch.Tensor], n_layers: int) -> torch.Tensor:
    """GradDrop's score from the plain estimate and the ``L - 1`` dropped ones (module docstring)."""
    return sum(e.abs() for e in estimates) / max(n_layers - 1, 1)


def _replica_z(model: Model, tokens: torch.Tensor, layer: int, make_hooks: Callable[[int, int], list], n_rep: int,
               box: dict[str, torch.Tensor], cert: Certificate, split: bool) -> torch.Tensor:
    """Layer ``layer``'s ``z`` (replica, batch, pos, head, d_head) from ``n_rep`` copies of the run, each
    pass ended at that ``hook_z``: ``make_hooks(m0, m1)`` gives hooks acting on replicas ``m0 .. m1 - 1``
    stacked along the batch. One pass for all where each batch row is computed on its own (the
    certificate's ``rows``), else one pass per replica; from the cached stream entering ``layer`` where
    running from a layer reproduces the model (``start at layer``), else from the tokens."""
    B = tokens.shape[0]
    out = []
    for m0, m1 in [(0, n_rep)] if cert.holds("rows") else [(m, m + 1) for m in range(n_rep)]:
        got: dict[str, torch.Tensor] = {}

        def grab(t: torch.Tensor, *, hook) -> None:
            got["z"] = t.detach()
            raise Stop

        k = m1 - m0
        fwd = make_hooks(m0, m1) + [(N.z(layer), grab)]
        x, start, spe = stacked_start(model, tokens, box, layer, k, cert.holds("start at layer"))
        with routed(model, fwd, split=split) as runnable, model.hooks(fwd_hooks=runnable), torch.no_grad():
            try:
                run_from(model, x, start=start, spe=spe)
            except Stop:
                pass
        out.append(got["z"].to(torch.float64).reshape(k, B, *got["z"].shape[1:]))
    return torch.cat(out)


def node_qk_deltas(model: Model, tokens: torch.Tensor, ref: dict[str, torch.Tensor], box: dict[str, torch.Tensor],
                   cert: Certificate, which: str, progress: bool) -> dict[int, torch.Tensor]:
    """Per layer, ``z' - z`` (batch, pos, head, d_head) with every head's ``hook_{which}`` (``q`` or
    ``k``) set to the reference run's: each head's output with its own query or key patched (a key of
    a KV head moves the query heads that read it)."""
    out = {}
    B, H = tokens.shape[0], model.cfg.n_heads
    alone = _backend.qk_norm_spans_heads(model)  # one head's patch moves the others' normalised queries: one copy each
    for l in bar(range(model.cfg.n_layers), desc="QK fix", enabled=progress, unit="layer"):
        name = N.projection(l, which)
        # the heads (or KV heads) of hook_{which}, each patched on its own copy
        slots = ref[name].shape[2] if alone else 1

        def make(m0: int, m1: int, name: str = name) -> list:
            def patch(t: torch.Tensor, *, hook) -> torch.Tensor:
                t = t.clone()
                for m in range(max(m0, 1), m1):  # replica 0: the run; replica m: patched (alone: slot m - 1 only)
                    rows = slice((m - m0) * B, (m - m0 + 1) * B)
                    if alone:
                        t[rows, :, m - 1] = ref[name][:, :, m - 1].to(t.dtype)
                    else:
                        t[rows] = ref[name].to(t.dtype)
                return t
            return [(name, patch)]

        z = _replica_z(model, tokens, l, make, slots + 1, box, cert, split=False)
        if alone:
            group = H // slots
            out[l] = torch.stack([z[1 + h // group][:, :, h] - z[0][:, :, h] for h in range(H)], dim=2)
        else:
            out[l] = z[1] - z[0]
    return out


def edge_qk_fix(model: Model, layout: EdgeLayout, tokens: torch.Tensor, delta: torch.Tensor,
                grads: list[dict[int, torch.Tensor]], box: dict[str, torch.Tensor], cert: Certificate,
                per_example: bool, budget: int, progress: bool) -> list[torch.Tensor]:
    """The QK-fixed estimate of every edge into a query or key input, for each set of ``dm/dz``
    gradients in ``grads`` (one per GradDrop round): per set, (batch or 1, sender, receiver), NaN off
    those columns. ``delta``: the senders' writes (sender, batch, pos, d_model); ``box``: the run's
    stream entering each layer and its ``hook_q``, ``hook_k``, ``hook_v`` and ``hook_pattern``.

    Where a layer's projections are ``ln1(resid_pre) W + b`` (:func:`rs_interp._backend.projection_layers`,
    the certificate's ``projections``) and its pattern the causal softmax of their scores (``scores``),
    the patched patterns are formed by hand (:func:`_by_hand`), for a chunk of senders at once; elsewhere
    by the model's own attention on copies of the run (:func:`_by_replicas`)."""
    cfg = model.cfg
    B = tokens.shape[0]
    H = cfg.n_heads
    S, R = len(layout.senders), len(layout.receivers)
    out = [torch.full((B if per_example else 1, S, R), float("nan"), dtype=torch.float64) for _ in grads]
    upstream = layout.exists.sum(0).tolist()
    fast = _backend.projection_layers(model) if cert.holds("scores") else set()
    for l in bar(range(cfg.n_layers), desc="QK fix", enabled=progress, unit="layer"):
        cols = {x: [j for j, r in enumerate(layout.receivers) if r.startswith(f"L{l}") and r.endswith(f".{x}")]
                for x in "qk"}
        senders = list(range(upstream[cols["q"][0]]))
        if l in fast:
            chunks = _by_hand(model, l, box, delta, senders, budget)
        else:
            chunks = _by_replicas(model, tokens, l, box, delta, senders, budget, cert)
        for reps, dz in chunks:  # dz: (replica, batch, pos, head, d_head), replica (sender, "q" or "k")
            for g_set, buf in zip(grads, out):
                # each replica's change of the metric, per head
                per_head = torch.einsum("rbphd,bphd->rbh", dz, g_set[l])
                for m, (i, x) in enumerate(reps):
                    for j in cols[x]:
                        value = per_head[m][:, _heads_of(layout.receivers[j], H, len(cols["k"]))].sum(-1)
                        buf[:, i, j] = value if per_example else value.sum()
    return out


def _by_replicas(model: Model, tokens: torch.Tensor, l: int, box: dict, delta: torch.Tensor, senders: list[int],
                 budget: int, cert: Certificate) -> Iterator[tuple[list, torch.Tensor]]:
    """Layer ``l``'s ``z' - z`` per (sender, q or k): ``w_s`` added to every head's query (or key)
    input of a copy of the run (:func:`_replica_z`: stacked where rows hold), the model's own pass ended
    at ``hook_z``. Each head's output is then the one with its own input moved alone: a head's q, k and v
    depend on its own inputs only (the certificate's ``head inputs``; a norm spanning the heads is applied
    to each head's own copy, ``rs_interp._backend.head_copies``)."""
    cfg = model.cfg
    B, P = tokens.shape
    # per copy: the per-head query, key and value inputs and their normalised copies (a dozen
    # (head, d_model) tensors in flight under the split-input fork) and a block's transients
    per_copy = B * P * cfg.d_model * (12 * cfg.n_heads + 8) * torch.finfo(cfg.dtype).bits // 8
    per_pass = max(2, budget // max(1, per_copy))
    reps_all = [(i, x) for i in senders for x in "qk"]
    for c in range(0, len(reps_all), per_pass - 1):
        reps = reps_all[c : c + per_pass - 1]
        n = len(reps) + 1  # replica 0: the run itself, subtracted from the same pass's copies
        adds = {x: torch.zeros(n * B, P, cfg.d_model, dtype=torch.float64) for x in "qk"}
        for m, (i, x) in enumerate(reps, start=1):
            adds[x][m * B : (m + 1) * B] = delta[i]

        def make(m0: int, m1: int, adds: dict = adds) -> list:
            def patch(x: str) -> Callable:
                # a per-head input (batch, pos, head or kv_head, d_model)
                def fn(t: torch.Tensor, *, hook) -> torch.Tensor:
                    return t + adds[x][m0 * B : m1 * B, :, None, :].to(t.dtype)  # broadcast over every head
                return fn
            return [(N.qkv_input(l, x), patch(x)) for x in "qk"]

        z = _replica_z(model, tokens, l, make, n, box, cert, split=True)
        yield reps, z[1:] - z[0]


def _norm(model: Model, l: int, x: torch.Tensor) -> torch.Tensor:
    """Layer ``l``'s first norm as it computes (:func:`rs_interp._backend.norm_of`), in ``x``'s dtype."""
    return _backend.pre_norm(model, l, "ln1").to(x.dtype).apply(x)


def _pattern(model: Model, l: int, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(n, head, query, key) softmax of the causal scores of ``q`` (n, pos, head, d_head) against ``k``
    (n, pos, kv_head, d_head), rotated where the positions are rotary."""
    cfg = model.cfg
    if cfg.positional_embedding_type == "rotary":
        q, k = _backend.apply_rotary(model, l, q), _backend.apply_rotary(model, l, k)
    k = per_query_head(k, cfg.n_heads, -2)
    s = torch.einsum("nqhd,nkhd->nhqk", q, k) / _backend.attn_scale(model, l)
    P = s.shape[-1]
    return s.masked_fill(torch.ones(P, P, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def _by_hand(model: Model, l: int, box: dict, delta: torch.Tensor, senders: list[int],
             budget: int) -> list[tuple[list, torch.Tensor]]:
    """Layer ``l``'s ``z' - z`` per (sender, q or k) formed from its projections: ``q' = ln1(x + w_s)
    W_Q + b_Q`` (``k'`` alike), the causal softmax of the rotated scores, ``z' - z = (A' - A) v``: on the
    layers whose projections and patterns the certificate vouches for (``projections``, ``scores``)."""
    cfg = model.cfg
    H = cfg.n_heads
    x = box[N.resid_pre(l)].to(torch.float64)
    q, k, v = (box[N.projection(l, n)].to(torch.float64) for n in "qkv")
    G = k.shape[2]
    W = {n: reader_weight(model, l, f"W_{n.upper()}", G if n == "k" else H, torch.float64) for n in "qk"}
    ln = _norm(model, l, x)
    A = _pattern(model, l, q, k)
    v = per_query_head(v, H, -2)
    B, P = x.shape[:2]
    per_sender = 8 * B * P * (6 * H * P + 4 * cfg.d_model + 4 * H * cfg.d_head)
    step = max(1, budget // per_sender)
    out = []
    for c in range(0, len(senders), step):
        chunk = senders[c : c + step]
        moved = _norm(model, l, x + delta[chunk]) - ln  # (sender, batch, pos, d_model)
        reps, dz = [], []
        for n in "qk":
            d = torch.einsum("sbpm,hmd->sbphd", moved, W[n]).flatten(0, 1)
            Ap = _pattern(model, l, q.repeat(len(chunk), 1, 1, 1) + d, k.repeat(len(chunk), 1, 1, 1)) if n == "q" else \
                _pattern(model, l, q.repeat(len(chunk), 1, 1, 1), k.repeat(len(chunk), 1, 1, 1) + d)
            dz.append(torch.einsum("nhqk,nkhd->nqhd", Ap - A.repeat(len(chunk), 1, 1, 1), v.repeat(len(chunk), 1, 1, 1))
                      .unflatten(0, (len(chunk), B)))
            reps += [(i, n) for i in chunk]
        out.append((reps, torch.cat(dz)))
    return out


def _heads_of(receiver: str, n_heads: int, n_kv: int) -> list[int]:
    """The query heads whose output a query or key receiver moves: its own, or the KV head's group."""
    c = parse(receiver)
    if c.kind == "kv_head":
        group = n_heads // n_kv
        return list(range(c.index * group, (c.index + 1) * group))
    return [c.index]
