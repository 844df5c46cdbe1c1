"""Where each component reads the residual stream: the readers, their hook points, their gradients.

Every input that reads the stream is a *reader*: each head's query, key and value input (per KV head
for keys and values under grouped-query attention), each MLP's input and the final stream the
unembedding reads. Read at their hook points, their gradients add up to the stream's (every reader
counted once: the identity :func:`rs_interp.certify` checks as ``readers``). The edge methods read
them here; so does the certificate.

A head's input is read one of two ways:

- *split*: TransformerLens's per-head input ``blocks.L.hook_{q,k,v}_input`` (batch, pos, head,
  d_model), switched on for the call (:func:`rs_interp._backend.per_head_inputs`; emulated on
  TransformerLens 4's native attention);
- *projected*: the per-head projection ``blocks.L.attn.hook_{q,k,v}`` (batch, pos, head, d_head),
  whose gradient is taken back through ``W_{Q,K,V}`` and the frozen first norm by hand
  (:meth:`rs_interp.exact.norm.Norm.input_gradient`), with no per-head copy of the stream in the forward pass. Only on
  layers
  whose projection is ``ln1(resid_pre) W + b`` (:func:`rs_interp._backend.projection_layers`; the
  certificate checks it as ``projections``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model, Stop, attn_weight, kv_groups, per_head_inputs
from ..hooks import store_matching
from ..labels import LOGITS, mlp_label, parse, receiver_label

__all__: list[str] = []

#: The stream entering block 0 (what the ``embed`` sender writes).
RESID0 = N.RESID0


@dataclass(frozen=True)
class Reader:
    """A group of receivers read at one hook point.

    Attributes:
        layer: the layer (the last one for ``logits``).
        kind: ``"q"``, ``"k"``, ``"v"``, ``"mlp"`` or ``"logits"``.
        hook: the hook point the gradient is read at.
        labels: the receivers' labels, one per column of the gradient (heads or KV heads; one for an
            MLP and for ``logits``).
        projected: read at the per-head projection and taken back by hand (module docstring).
    """

    layer: int
    kind: str
    hook: str
    labels: tuple[str, ...]
    projected: bool


def mlp_flags(model: Model) -> dict[str, bool]:
    """The config flag the MLP readers need (``use_hook_mlp_in``), for :func:`rs_interp._state.preserve_state`."""
    return {} if model.cfg.attn_only else {"use_hook_mlp_in": True}


def readers(model: Model, *, projected: bool = True) -> list[Reader]:
    """Every reader of the stream in forward order: per layer its q, k and v inputs, then its MLP;
    last the final stream. ``projected=False`` reads every head's inputs split (what patching needs:
    a value is added to them); ``projected=True`` reads them projected where a layer allows."""
    cfg = model.cfg
    grouped = kv_groups(cfg) != cfg.n_heads
    by_projection = _backend.projection_layers(model) if projected else set()
    out = []
    for l in range(cfg.n_layers):
        for x in "qkv":
            kv = grouped and x != "q"
            n = kv_groups(cfg) if kv else cfg.n_heads
            labels = tuple(receiver_label(l, h, x, kv=kv) for h in range(n))
            if l in by_projection:
                out.append(Reader(l, x, N.projection(l, x), labels, True))
            else:
                out.append(Reader(l, x, N.qkv_input(l, x), labels, False))
        if not cfg.attn_only:
            out.append(Reader(l, "mlp", N.mlp_in(l), (mlp_label(l),), False))
    out.append(Reader(cfg.n_layers - 1, "logits", N.final_stream(cfg.n_layers), (LOGITS,), False))
    return out


def watched(t: torch.Tensor, contract: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """A copy of ``t`` that calls ``contract`` with its gradient, to be returned by the hook.

    The copy is what flows on from the hook point, so its gradient is through that reader alone:
    a TransformerLens 4 bridge hands some hooks a tensor that other readers share (the stream
    behind ``hook_mlp_in``), and goes on with its own tensor when a hook returns None or ``t`` itself.
    """
    out = t.clone()
    out.register_hook(contract)
    return out


def reader_weight(model: Model, layer: int, name: str, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Layer ``layer``'s ``W_{Q,K,V}`` (reader, d_model, d_head) or ``b_{Q,K,V}`` (reader, d_head), ``name``,
    detached (in ``dtype``, if given), for ``n`` readers: one per head, or one per KV head where ``n`` is
    fewer (query head ``h`` reads KV head ``h // group``)."""
    t = attn_weight(model.blocks[layer].attn, name, model.cfg.n_heads).detach()
    t = t if dtype is None else t.to(dtype)
    return t if n == model.cfg.n_heads else t[:: model.cfg.n_heads // n]


def _through_projection(model: Model, reader: Reader, stream: dict[int, torch.Tensor], dt: torch.dtype) -> Callable:
    """``hook_{x}``'s gradient (batch, pos, head, d_head) -> the per-head inputs' (head, batch * pos *
    d_model) in ``dt``, written into the caller's buffer: the norm's input gradient behind the projection
    (:meth:`rs_interp.exact.norm.Norm.through_projection`), the stream's statistics those of the run."""
    l, x = reader.layer, reader.kind
    W = reader_weight(model, l, f"W_{x.upper()}", len(reader.labels), dt)  # (head or KV head, d_model, d_head)
    through = _backend.pre_norm(model, l, "ln1").to(dt).through_projection(W)

    def to_input(grad: torch.Tensor, out: torch.Tensor) -> None:
        g = grad.to(dt).flatten(0, 1).transpose(0, 1)  # (head, row, d_head)
        through(g, stream[l].to(dt).flatten(0, 1), out=out.view(g.shape[0], g.shape[1], -1))

    return to_input


@contextlib.contextmanager
def reader_gradients(model: Model, wanted: Sequence[Reader], on_grad: Callable[[Reader, Callable], None],
                     dt: torch.dtype, *,
                     extra: Sequence[tuple[str, Callable]] = ()) -> Iterator[list[tuple[str, Callable]]]:
    """Forward hooks that call ``on_grad(reader, fill)`` as each reader's input gradient is computed in
    the backward pass, where ``fill(out)`` writes it into ``out`` (column, batch * pos * d_model) in
    ``dt``, one row per label (the caller's buffer, reused: no allocation per reader), the inputs read
    before their norm (read projected, they are taken back through it: :func:`_through_projection`).

    Yields the hooks to apply with ``model.hooks``, ``extra`` (the caller's own) first (per-head input
    hooks routed where a layer needs them); restores what it switched on.
    """
    stream: dict[int, torch.Tensor] = {}

    def keep_stream(t: torch.Tensor, *, hook) -> None:
        stream[N.layer_of(hook.name)] = t.detach()

    def hook_for(reader: Reader) -> Callable:
        to_input = _through_projection(model, reader, stream, dt) if reader.projected else None

        def fwd(t: torch.Tensor, *, hook) -> torch.Tensor:
            def contract(grad: torch.Tensor) -> None:
                grad = grad.detach()  # (the Hessian correction's first backward builds a graph)

                def fill(out: torch.Tensor) -> None:
                    if to_input is not None:
                        to_input(grad, out)
                    elif grad.ndim == 4:  # per-head inputs: (batch, pos, head or kv_head, d_model)
                        out.view(grad.shape[2], *grad.shape[:2], grad.shape[3]).copy_(grad.permute(2, 0, 1, 3))
                    else:
                        out.view(grad.shape).copy_(grad)

                on_grad(reader, fill)

            return watched(t, contract)

        return fwd

    fwd: list[tuple[str, Callable]] = list(extra)
    for l in sorted({r.layer for r in wanted if r.projected}):
        fwd.append((N.resid_pre(l), keep_stream))
    fwd += [(r.hook, hook_for(r)) for r in wanted]
    with routed(model, fwd, split=any(r.kind in "qkv" and not r.projected for r in wanted)) as runnable:
        yield runnable


@contextlib.contextmanager
def routed(model: Model, fwd: Sequence[tuple], *, split: bool) -> Iterator[list]:
    """``fwd`` ready for ``model.hooks``: with ``split`` (a hook of it reads a head's input split,
    ``hook_{q,k,v}_input``), through :func:`rs_interp._backend.per_head_inputs` (TransformerLens's
    per-head inputs switched on for the block, or emulated, and restored); else as given (the model's
    own pass, no per-head copy of the stream)."""
    with (per_head_inputs(model, fwd) if split else contextlib.nullcontext(list(fwd))) as runnable:
        yield runnable


def start_points(model: Model, layers: set[int] | None = None, *, attention: bool = False) -> Callable[[str], bool]:
    """The hook points a pass started at a layer reads (:func:`stacked_start`): the stream entering
    each of ``layers`` (default every layer) and, on shortformer positions, ``hook_pos_embed``; with
    ``attention``, also each of those layers' ``hook_q``, ``hook_k``, ``hook_v`` and ``hook_pattern``."""
    layers = set(range(model.cfg.n_layers)) if layers is None else layers
    names = {N.resid_pre(l) for l in layers}
    names |= ({N.projection(l, n) for l in layers for n in ("q", "k", "v")} | {N.pattern(l) for l in layers}
              if attention else set())
    short = model.cfg.positional_embedding_type == "shortformer"
    return lambda n: n in names or (short and n == N.POS_EMBED)


def stacked_start(model: Model, tokens: torch.Tensor, box: dict[str, torch.Tensor], layer: int, copies: int,
                  from_layer: bool) -> tuple[torch.Tensor, int | None, torch.Tensor | None]:
    """Where ``copies`` copies of the run, stacked along the batch, start: ``(x, start, spe)`` for
    :func:`rs_interp._backend.run_from`. With ``from_layer`` (where running from a layer reproduces
    the model: the certificate's ``start at layer``), the stream entering ``layer`` cached in ``box``
    (:func:`start_points`) and the shortformer positions; else the tokens (``start=None``)."""
    if not from_layer:
        return tokens.repeat(copies, 1), None, None
    spe = box.get(N.POS_EMBED) if model.cfg.positional_embedding_type == "shortformer" else None
    return box[N.resid_pre(layer)].repeat(copies, 1, 1), layer, None if spe is None else spe.repeat(copies, 1, 1)


def zero_leaf(model: Model) -> tuple[torch.Tensor, tuple[str, Callable]]:
    """A 0-d zero leaf that requires grad and the hook adding it to ``hook_embed``: a backward pass to
    that leaf alone (``inputs=[leaf]``) fires every tensor hook of the pass and gives no parameter a ``.grad``.

    >>> leaf, (name, _) = zero_leaf(__import__("rs_interp").load_toy_model("induction-1l"))
    >>> name, float(leaf), leaf.requires_grad
    ('hook_embed', 0.0, True)
    """
    leaf = torch.zeros((), dtype=model.cfg.dtype, requires_grad=True)
    return leaf, (N.EMBED, lambda t, *, hook: t + leaf)


def record(model: Model, tokens: torch.Tensor, names: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """The activations at the hook points ``names`` selects, from a no-grad run on ``tokens``, which
    ends (:class:`Stop`) as soon as the last of them is recorded: the blocks after it and the
    unembedding (which TransformerLens 4 computes even for ``return_type=None``) are skipped."""
    box: dict[str, torch.Tensor] = {}
    stores = store_matching(box, model, names)

    def stop_when_done(fn: Callable) -> Callable:
        def hook(t: torch.Tensor, *, hook) -> None:
            fn(t, hook=hook)
            if len(box) == len(stores):
                raise Stop

        return hook

    try:
        with torch.no_grad(), model.hooks(fwd_hooks=[(n, stop_when_done(fn)) for n, fn in stores]):
            model(tokens, return_type=None)
    except Stop:
        pass
    return box


def ablation_values(model: Model, reference: torch.Tensor, ablation: str,
                    names: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """What an ablated activation is set to, at each hook point ``names`` selects, from a run on
    ``reference`` (:func:`record`), by ``ablation`` (:data:`rs_interp.Ablation`): ``"resample"``, the
    reference's own (batch, pos, ...); ``"position_mean"``, its mean over the batch (1, pos, ...);
    ``"mean"``, over the batch and the positions (1, 1, ...): each broadcasts against the run's
    activation. ``"zero"`` needs no run: the caller's zeros.

    >>> import rs_interp as ri
    >>> model, ref = ri.load_toy_model("induction-1l"), ri.induction_batch(3, seed=0).tokens
    >>> means = ablation_values(model, ref, "mean", lambda n: n == "blocks.0.attn.hook_z")
    >>> tuple(means["blocks.0.attn.hook_z"].shape) == (1, 1, model.cfg.n_heads, model.cfg.d_head)
    True
    """
    if ablation == "zero":
        raise ValueError("a zero ablation needs no reference run: the caller's zeros")
    box = record(model, reference, names)
    if ablation == "position_mean":
        return {k: v.mean(0, keepdim=True) for k, v in box.items()}
    if ablation == "mean":
        return {k: v.mean((0, 1), keepdim=True) for k, v in box.items()}
    return box


def receiver_hook(label: str, n_layers: int) -> tuple[int, str, int | None]:
    """Where a value is added to one receiver's input, split: (its layer, the hook point, the head or
    KV-head index along the hook's head axis, None for an MLP's input and the final stream).

    >>> receiver_hook("L1KV0.k", 2), receiver_hook("MLP0", 2), receiver_hook("logits", 2)
    ((1, 'blocks.1.hook_k_input', 0), (0, 'blocks.0.hook_mlp_in', None), (1, 'blocks.1.hook_resid_post', None))
    """
    c = parse(label)
    if c.kind == "logits":
        return n_layers - 1, N.final_stream(n_layers), None
    if c.kind == "mlp":
        return c.layer, N.mlp_in(c.layer), None
    if c.input is None:
        raise ValueError(f"{label!r} is a sender, not a receiver (a head is read as .q, .k or .v)")
    return c.layer, N.qkv_input(c.layer, c.input), c.index
