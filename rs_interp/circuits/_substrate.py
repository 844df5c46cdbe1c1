"""What the circuit methods share: the runs they record, the senders' writes, the gradient passes.

- the pair of runs: :func:`check_pair` (``tokens`` and ``reference``), :func:`record` (a run's
  activations, ended once recorded);
- the senders (``embed``, every head, every MLP): :func:`sender_points` (where their writes are
  read), :func:`writes` (each sender's ``write_ref - write``, in the graph's order);
- the gradient passes: :func:`backward` (one pass, from a zero leaf at the embedding: the points of
  :func:`ig_alphas` run through it, :func:`rs_interp.circuits.correction.run_passes`), :func:`scalar_metric`,
  :func:`needs_gradients`, :func:`outside_inference_mode`.

The receivers (every reader of the stream, and its gradient) are :mod:`rs_interp.exact.stream`'s, which
the certificate (:func:`rs_interp.certify`) reads too.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Literal

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model
from .._state import frozen, outside_inference_mode  # noqa: F401  (the circuit methods read them here)
from ..exact.postnorm import attn_post, frozen_changes, linearised_heads, patched_heads
from ..exact.stream import RESID0, record, zero_leaf  # noqa: F401  (record: the circuit methods read it here)
from ..exact.validate import check_int_range, check_tokens
from ..metrics import Metric

__all__: list[str] = []


def check_pair(model: Model, tokens: torch.Tensor, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` and ``reference`` checked, of one shape (pair ``b`` is row ``b`` of each)."""
    tokens = check_tokens(model, tokens)
    reference = check_tokens(model, reference, "reference")
    if reference.shape != tokens.shape:
        raise ValueError(f"reference must have the shape of tokens {tuple(tokens.shape)}, got {tuple(reference.shape)}")
    return tokens, reference


def scalar_metric(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    """``metric(logits)`` as a 0-d tensor with gradients.

    Raises:
        ValueError: not a one-element tensor, not differentiable in the logits, or not finite.
    """
    value = metric(logits)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError("metric must return a scalar tensor (a differentiable function of the logits)")
    if not value.requires_grad:
        raise ValueError("metric must be differentiable in the logits (its result does not require grad)")
    if not bool(torch.isfinite(value.detach()).all()):
        raise ValueError(f"metric returned {float(value.detach())} on the run being differentiated: a metric must be "
                         "finite")
    return value.reshape(())


#: The hook point of each input sender (:func:`rs_interp.edge_layout`'s ``embedding``).
INPUT_POINTS = {"embed": RESID0, "tok_embed": N.EMBED, "pos_embed": N.POS_EMBED}


def sender_points(model: Model, embedding: str = "sum") -> Callable[[str], bool]:
    """The hook points whose activations make the senders' writes: the input senders' (the stream
    entering block 0, or ``hook_embed`` and ``hook_pos_embed``: :data:`INPUT_POINTS`), every
    ``hook_z`` (a head writes ``z W_O``) and every ``hook_mlp_out``."""
    from .graph import EMBEDDINGS

    mlps = not model.cfg.attn_only
    inputs = {INPUT_POINTS[s] for s in EMBEDDINGS[embedding]}
    is_z, is_out = N.every(N.z), N.every(N.mlp_out)
    return lambda n: n in inputs or is_z(n) or (mlps and is_out(n))


def n_senders(model: Model) -> int:
    cfg = model.cfg
    return 1 + cfg.n_layers * (cfg.n_heads + (not cfg.attn_only))


def writes(model: Model, ref: dict[str, torch.Tensor], run: dict[str, torch.Tensor], *, patched: bool = False,
           at: dict[str, torch.Tensor] | None = None, dtype: torch.dtype = torch.float64,
           frozen_norms: bool = False) -> torch.Tensor:
    """(sender, batch, pos, d_model) in ``dtype`` (default float64; the edge estimate's contraction asks
    for its own): each sender's ``write_ref - write``, in the graph's order, written into one buffer (the
    heads' writes by one batched product per layer). On a post-norm block a head's change passes the norm
    after the attention (:mod:`rs_interp.exact.postnorm`), always formed in float64 (then cast): to first
    order, its Jacobian at the run (the gradient methods), or ``patched``, the exact change of what the
    attention adds to the stream when only that head is patched (path patching). ``at``: the heads' outputs
    of the pass whose Jacobian is taken (an integrated-gradients point; default the run's). ``frozen_norms``: the
    post-norm's scale held at the run's (:func:`rs_interp.exact.postnorm.frozen_changes`: relevance patching)."""
    if dtype != torch.float64 and _backend.has_post_norms(model):
        return writes(model, ref, run, patched=patched, at=at, frozen_norms=frozen_norms).to(dtype)
    cfg = model.cfg
    shape = ref[RESID0].shape
    out = torch.empty(n_senders(model), *shape, dtype=dtype, device=ref[RESID0].device)
    torch.sub(ref[RESID0].to(dtype), run[RESID0].to(dtype), out=out[0])
    i = 1
    for l in range(cfg.n_layers):
        z = N.z(l)
        delta = (ref[z] - run[z]).to(dtype)  # (batch, pos, head, d_head)
        W_O = model.blocks[l].attn.W_O.detach().to(dtype)  # (head, d_head, d_model)
        H = W_O.shape[0]
        if attn_post(model, l, torch.float64).kind is not None:
            out[i : i + H] = (patched_heads(model, l, run[z], delta, torch.float64) if patched
                              else frozen_changes(model, l, run[z], delta, torch.float64) if frozen_norms
                              else linearised_heads(model, l, (run if at is None else at)[z], delta, torch.float64))
        else:
            torch.bmm(delta.flatten(0, 1).transpose(0, 1), W_O, out=out[i : i + H].view(H, -1, shape[-1]))
        i += H
        if not cfg.attn_only:
            m = N.mlp_out(l)
            torch.sub(ref[m].to(dtype), run[m].to(dtype), out=out[i])
            i += 1
    return out


def contract(W: torch.Tensor, G: torch.Tensor, *, per_example: bool, spans: torch.Tensor | None) -> torch.Tensor:
    """``W . G``: the writes ``W`` (sender, batch, pos, d_model) against the coefficients ``G`` (column, batch, pos,
    d_model), (batch or 1, sender, column, span or 1) in float64: one product per batch row (summing its pos *
    d_model terms in ``W``'s dtype) or, with ``spans`` (batch, pos, span) one-hot, per (row, position), each
    position's d_model terms, added into its span in float64; rows summed unless ``per_example``."""
    k, c, B = W.shape[0], G.shape[0], W.shape[1]
    if spans is None:
        out = torch.bmm(W.reshape(k, B, -1).transpose(0, 1),
                        G.reshape(c, B, -1).permute(1, 2, 0)).to(torch.float64)[..., None]
    else:
        P = W.shape[2]
        per = torch.bmm(W.reshape(k, B * P, -1).transpose(0, 1),
                        G.reshape(c, B * P, -1).permute(1, 2, 0)).to(torch.float64)
        out = torch.einsum("bpkc,bps->bkcs", per.view(B, P, k, c), spans.to(torch.float64))
    return out if per_example else out.sum(0, keepdim=True)


IGRule = Literal["left", "right"]
IG_RULES = ("left", "right")


def ig_alphas(ig_steps: int | None, ig_rule: str) -> list[float]:
    """Where the gradient passes run on the line from the reference's input embedding (0) to the
    run's (1): ``[1]`` for plain attribution patching (``ig_steps=None``); for EAP-IG with ``m``
    steps, ``k / m`` for ``k = 0 .. m - 1`` (``"left"``, the Riemann sum of Hanna et al.'s code) or
    ``k = 1 .. m`` (``"right"``).

    >>> ig_alphas(None, "left"), ig_alphas(4, "left"), ig_alphas(4, "right")
    ([1.0], [0.0, 0.25, 0.5, 0.75], [0.25, 0.5, 0.75, 1.0])
    """
    if ig_rule not in IG_RULES:
        raise ValueError(f"ig_rule must be one of {IG_RULES}, got {ig_rule!r}")
    if ig_steps is None:
        return [1.0]
    m = check_int_range("ig_steps", ig_steps, 1)
    return [k / m for k in (range(m) if ig_rule == "left" else range(1, m + 1))]


@contextlib.contextmanager
def needs_gradients() -> Iterator[None]:
    """Turn PyTorch's error on backpropagating through inference tensors into a ValueError that says why.

    Raises:
        ValueError: the model's weights are inference tensors (nothing can be backpropagated).
    """
    try:
        yield
    except RuntimeError as err:
        if "nference tensor" not in str(err):
            raise
        raise ValueError("attribution patching needs gradients, but the model's weights are inference tensors "
                         "(created under torch.inference_mode()); load the model outside it") from err


def backward(model: Model, tokens: torch.Tensor, metric: Metric, fwd: list) -> float:
    """Forward with ``fwd`` hooks (which register tensor hooks) and a zero leaf at the embedding
    (:func:`rs_interp.exact.stream.zero_leaf`), then backpropagate to that leaf alone: every tensor
    hook fires, no parameter gets a ``.grad``.

    Raises:
        ValueError: the model's weights are inference tensors (:func:`needs_gradients`).
    """
    with torch.enable_grad(), frozen(model):
        leaf, at_embed = zero_leaf(model)
        with model.hooks(fwd_hooks=[at_embed] + fwd), needs_gradients():
            value = scalar_metric(metric, _backend.logits_with_grad(model, tokens))
            torch.autograd.backward(value, inputs=[leaf])
    return float(value.detach())


def scalar_metric_value(metric: Metric, logits: torch.Tensor, what: str) -> float:
    """``metric(logits)`` as a finite float (:func:`rs_interp.metrics.metric_value`)."""
    from ..metrics import metric_value

    return metric_value(metric(logits), what)
