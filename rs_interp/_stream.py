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
  (:func:`input_gradient`), with no per-head copy of the stream in the forward pass. Only on layers
  whose projection is ``ln1(resid_pre) W + b`` (:func:`rs_interp._backend.projection_layers`; the
  certificate checks it as ``projections``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from . import _backend
from ._backend import Model, Stop, attn_weight, kv_groups, per_head_inputs
from ._exact import compute_dtype
from .hooks import store_matching
from .labels import LOGITS, mlp_label, parse, receiver_label

__all__: list[str] = []

#: The stream entering block 0 (what the ``embed`` sender writes).
RESID0 = "blocks.0.hook_resid_pre"


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
                out.append(Reader(l, x, f"blocks.{l}.attn.hook_{x}", labels, True))
            else:
                out.append(Reader(l, x, f"blocks.{l}.hook_{x}_input", labels, False))
        if not cfg.attn_only:
            out.append(Reader(l, "mlp", f"blocks.{l}.hook_mlp_in", (mlp_label(l),), False))
    out.append(Reader(cfg.n_layers - 1, "logits", f"blocks.{cfg.n_layers - 1}.hook_resid_post", (LOGITS,), False))
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


def input_gradient(kind: str | None, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The gradient at a norm's input ``x`` (row, d_model) given the gradient ``dy`` at its output
    (head, row, d_model), one input per head, the statistics those of ``x``:
    ``(g - mean(g) - n mean(g n)) / s`` with ``g = dy * w``, ``n`` the normalised input, ``s`` its
    scale (no centring for RMS).

    >>> x, dy = torch.randn(3, 8, dtype=torch.float64, requires_grad=True), torch.randn(1, 3, 8, dtype=torch.float64)
    >>> y = torch.nn.functional.layer_norm(x, (8,), eps=1e-5)
    >>> (auto,) = torch.autograd.grad(y, x, dy[0])
    >>> bool(torch.allclose(input_gradient("LNPre", dy, x.detach(), None, 1e-5)[0], auto))
    True
    """
    if kind is None:
        return dy
    g = dy * w if w is not None else dy
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    s = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    n = x / s
    dx = g - n * (g * n).mean(-1, keepdim=True)
    if kind in ("LN", "LNPre"):
        dx = dx - g.mean(-1, keepdim=True)
    return dx / s


def _through_projection(model: Model, reader: Reader, stream: dict[int, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """hook_{x}'s gradient (batch, pos, head, d_head) -> the per-head inputs' (head, batch * pos * d_model)."""
    cfg, l, x = model.cfg, reader.layer, reader.kind
    dt = compute_dtype(model)
    W = attn_weight(model.blocks[l].attn, f"W_{x.upper()}", cfg.n_heads).detach().to(dt)  # (head, d_model, d_head)
    if len(reader.labels) != cfg.n_heads:
        W = W[:: cfg.n_heads // len(reader.labels)]  # one per KV head: query head h reads KV head h // group
    kind, gain, _, eps = _backend.norm_affine(model, model.blocks[l].ln1) if cfg.normalization_type else (None, None, None, 0.0)
    gain = None if gain is None else gain.detach().to(dt)

    def to_input(grad: torch.Tensor) -> torch.Tensor:
        dy = torch.bmm(grad.to(dt).flatten(0, 1).transpose(0, 1), W.transpose(1, 2))  # (head, batch * pos, d_model)
        return input_gradient(kind, dy, stream[l].to(dt).flatten(0, 1), gain, eps).flatten(1)

    return to_input


@contextlib.contextmanager
def reader_gradients(model: Model, wanted: Sequence[Reader], on_grad: Callable[[Reader, torch.Tensor], None], *,
                     extra: Sequence[tuple[str, Callable]] = ()) -> Iterator[list[tuple[str, Callable]]]:
    """Forward hooks that call ``on_grad(reader, G)`` with each reader's input gradient as it is
    computed in the backward pass: ``G`` (batch * pos * d_model, column) in float64, one column per
    label (a transposed view where it can be), the inputs read before their norm.

    Yields the hooks to apply with ``model.hooks``, ``extra`` (the caller's own) first (per-head input
    hooks routed where a layer needs them); restores what it switched on.
    """
    stream: dict[int, torch.Tensor] = {}

    def keep_stream(t: torch.Tensor, *, hook) -> None:
        stream[int(hook.name.split(".")[1])] = t.detach()

    def hook_for(reader: Reader) -> Callable:
        to_input = _through_projection(model, reader, stream) if reader.projected else None

        def fwd(t: torch.Tensor, *, hook) -> torch.Tensor:
            def contract(grad: torch.Tensor) -> None:
                if to_input is not None:  # (head, batch * pos * d_model) -> a transposed view
                    on_grad(reader, to_input(grad).to(torch.float64).T)
                    return
                g = grad.to(torch.float64)
                if g.ndim == 4:  # per-head inputs: (batch, pos, head or kv_head, d_model)
                    on_grad(reader, g.transpose(2, 3).reshape(-1, g.shape[2]))
                else:
                    on_grad(reader, g.reshape(-1, 1))

            return watched(t, contract)

        return fwd

    fwd: list[tuple[str, Callable]] = list(extra)
    for l in sorted({r.layer for r in wanted if r.projected}):
        fwd.append((f"blocks.{l}.hook_resid_pre", keep_stream))
    fwd += [(r.hook, hook_for(r)) for r in wanted]
    split = any(r.kind in "qkv" and not r.projected for r in wanted)
    with (per_head_inputs(model, fwd) if split else contextlib.nullcontext(fwd)) as runnable:
        yield runnable


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


def receiver_hook(label: str, n_layers: int) -> tuple[int, str, int | None]:
    """Where a value is added to one receiver's input, split: (its layer, the hook point, the head or
    KV-head index along the hook's head axis, None for an MLP's input and the final stream).

    >>> receiver_hook("L1KV0.k", 2), receiver_hook("MLP0", 2), receiver_hook("logits", 2)
    ((1, 'blocks.1.hook_k_input', 0), (0, 'blocks.0.hook_mlp_in', None), (1, 'blocks.1.hook_resid_post', None))
    """
    c = parse(label)
    if c.kind == "logits":
        return n_layers - 1, f"blocks.{n_layers - 1}.hook_resid_post", None
    if c.kind == "mlp":
        return c.layer, f"blocks.{c.layer}.hook_mlp_in", None
    if c.input is None:
        raise ValueError(f"{label!r} is a sender, not a receiver (a head is read as .q, .k or .v)")
    return c.layer, f"blocks.{c.layer}.hook_{c.input}_input", c.index
