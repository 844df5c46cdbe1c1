"""Attribution patching: a first-order estimate of every activation patch, from one backward pass.

Patching head ``h``'s ``z`` from a reference run into this run moves a metric by about

    AtP(h) = sum over batch and positions of (z_ref - z) . d metric / d z          (node level)

an exact derivative of the metric along the patch (tested against finite differences to 1e-6 in
float64); how well it predicts the real patch is a separate question, answered by comparing with
:func:`rs_interp.head_ablation_scan` (attention saturation is the usual failure) or refined with
``ig_steps`` (EAP-IG). Edges: :mod:`rs_interp.edge_attribution`.

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

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from einops import einsum
from tqdm.auto import tqdm
from jaxtyping import Float, Int
from ._backend import TL_MAJOR, Model, Stop

from .heads import head_labels
from .hooks import store_matching
from .metrics import Metric, top_effects
from ._state import preserve_state
from ._validate import check_int_range, check_tokens

__all__ = ["AttributionPatching", "attribution_patching"]


@dataclass(frozen=True)
class AttributionPatching:
    """Node-level estimates.

    Attributes:
        effect: (layer, head) the estimated change of the metric when the head's ``z`` is patched
            from the reference run (summed over positions).
        effect_per_position: (layer, head, pos) the same before the sum over positions.
        clean: the metric of the run on ``tokens``.
        labels: ``"L{l}H{h}"`` row-major (:func:`rs_interp.head_labels`).

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> atp = rs_interp.attribution_patching(model, a, metric, reference=b)
        >>> bool(atp.effect_per_position.sum(-1).allclose(atp.effect)), len(atp.top(3))
        (True, 3)
    """

    effect: Float[torch.Tensor, "layer head"]
    effect_per_position: Float[torch.Tensor, "layer head pos"]
    clean: float
    labels: tuple[str, ...]

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads with the largest estimated ``|effect|``, with their effect."""
        return top_effects(self.labels, self.effect, k)


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
    backpropagate to that leaf alone: every tensor hook fires, no parameter gets a ``.grad``.

    Raises:
        ValueError: the model's weights are inference tensors (nothing can be backpropagated).
    """
    with torch.enable_grad():
        leaf = torch.zeros((), dtype=model.cfg.dtype, requires_grad=True)
        fwd = [("hook_embed", lambda t, *, hook: t + leaf)] + fwd
        with model.hooks(fwd_hooks=fwd):
            try:
                value = _scalar_metric(metric, _logits(model, tokens))
                torch.autograd.backward(value, inputs=[leaf])
            except RuntimeError as err:
                if "nference tensor" not in str(err):
                    raise
                raise ValueError("attribution patching needs gradients, but the model's weights are inference tensors "
                                 "(created under torch.inference_mode()); load the model outside it") from err
    return float(value.detach())


def _logits(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """``model(tokens)``'s logits, with gradients. On TransformerLens 3.x the forward is ended at
    ``unembed.hook_in`` and the unembedding applied here, to the same ``W_U``: 3.9's ``Unembed`` copies
    ``W_U.T`` (the whole (d_vocab, d_model) matrix) into a contiguous tensor on every call, the
    largest copy of a gradient pass (~0.2 s of 1.5 s on GPT-2 small at 64 tokens). Hooks on
    ``unembed.hook_in`` and ``unembed.hook_out`` still run; models with a logit softcap take the
    model's own path.

    Remove when: TransformerLens 3.x is no longer supported.
    """
    unembed = getattr(model, "unembed", None)
    if (TL_MAJOR >= 4 or type(unembed).__name__ != "Unembed" or "unembed.hook_in" not in model.hook_dict
            or getattr(model.cfg, "output_logits_soft_cap", -1.0) > 0):
        return model(tokens, return_type="logits")
    box: dict[str, torch.Tensor] = {}

    def grab(t: torch.Tensor, *, hook) -> None:
        box["x"] = t
        raise Stop

    try:
        with model.hooks(fwd_hooks=[("unembed.hook_in", grab)]):
            model(tokens, return_type="logits")
    except Stop:
        pass
    return unembed.hook_out(torch.nn.functional.linear(box["x"], unembed.W_U.T, unembed.b_U))


def _outside_inference_mode(fn: Callable) -> Callable:
    """Run ``fn`` with ``torch.inference_mode`` switched off (a notebook's usual wrapper, under which
    nothing can be backpropagated), on normal copies of the token tensors."""

    @functools.wraps(fn)
    def wrapper(model: Model, tokens: torch.Tensor, metric: Metric, **kwargs):
        if not torch.is_inference_mode_enabled():
            return fn(model, tokens, metric, **kwargs)
        with torch.inference_mode(False):
            copy = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
            return fn(model, copy(tokens), metric, **{k: copy(v) for k, v in kwargs.items()})

    return wrapper


RESID0 = "blocks.0.hook_resid_pre"


def _record(model: Model, tokens: torch.Tensor, names: Callable[[str], bool]) -> dict[str, torch.Tensor]:
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


def _check_ig_steps(ig_steps: int | None) -> int:
    return 1 if ig_steps is None else check_int_range("ig_steps", ig_steps, 1)


def _gradient_passes(model: Model, tokens: torch.Tensor, metric: Metric, fwd: list, *, steps: int,
                     x_ref: torch.Tensor | None, progress: bool) -> float:
    """``steps`` forward and backward passes with ``fwd`` (whose tensor hooks accumulate): pass ``k``
    (1..steps) runs with the stream entering block 0 at ``x_ref + (k / steps) (x - x_ref)``, on the
    line from the reference's input embedding to the run's; the last pass is the run itself.
    Returns the run's metric."""
    value = float("nan")
    for k in tqdm(range(1, steps + 1), desc="integrated gradients", disable=not progress or steps == 1, leave=False):
        extra = []
        if k < steps:
            alpha = k / steps

            def interpolate(t: torch.Tensor, *, hook, alpha: float = alpha) -> torch.Tensor:
                return x_ref.to(t.dtype) + alpha * (t - x_ref.to(t.dtype))

            extra = [(RESID0, interpolate)]
        value = _backward(model, tokens, metric, extra + fwd)
    return value


@_outside_inference_mode
def attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    ig_steps: int | None = None,
    progress: bool = False,
) -> AttributionPatching:
    """Node-level attribution patching of every head's ``z`` (module docstring): one forward and one
    backward pass on ``tokens``, plus one forward pass on ``reference``.

    Args:
        metric: a :data:`rs_interp.Metric`, differentiable (e.g. :func:`rs_interp.next_token_loss`).
        reference: tokens of the reference run, the shape of ``tokens``.
        ig_steps: ``m`` for EAP-IG (Hanna et al. 2024): the gradient averaged over the ``m`` points
            ``x_ref + (k/m)(x - x_ref)``, ``k = 1..m``, on the line from the reference's input
            embedding (the stream entering block 0) to the run's, contracted with the same
            ``z_ref - z`` as plain attribution patching. ``m = 1`` is plain attribution patching;
            as ``m`` grows the average tends to the integral of the gradient along the line (error
            O(1/m)). Default: plain.
        progress: a progress bar over the ``m`` passes.

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> atp = attribution_patching(model, a, metric, reference=b)
        >>> tuple(atp.effect.shape), atp.labels[:2]
        ((2, 2), ('L0H0', 'L0H1'))
    """
    tokens, reference = _prepare(model, tokens, reference)
    steps = _check_ig_steps(ig_steps)
    L, n_heads, P = model.cfg.n_layers, model.cfg.n_heads, tokens.shape[1]
    per_pos = torch.zeros(L, n_heads, P, dtype=torch.float64)
    is_z = lambda n: n.endswith("attn.hook_z")  # noqa: E731
    with preserve_state(model):
        ref = _record(model, reference, lambda n: is_z(n) or n == RESID0)
        # Plain: the run's own z, read in the pass. IG: the run's z from a pass of its own (the
        # passes run at interpolated inputs).
        clean = _record(model, tokens, is_z) if steps > 1 else {}

        def on_z(z: torch.Tensor, *, hook) -> torch.Tensor:
            delta = (ref[hook.name] - (clean[hook.name] if clean else z.detach())).to(torch.float64)
            l = int(hook.name.split(".")[1])

            def contract(grad: torch.Tensor) -> None:
                per_pos[l] += einsum(delta, grad.to(torch.float64), "batch pos head_index d_head, batch pos head_index d_head -> head_index pos")

            return _watched(z, contract)

        value = _gradient_passes(model, tokens, metric, [(is_z, on_z)], steps=steps, x_ref=ref[RESID0], progress=progress)
    per_pos /= steps
    return AttributionPatching(effect=per_pos.sum(-1), effect_per_position=per_pos, clean=value, labels=head_labels(L, n_heads))
