"""Attribution patching: a first-order estimate of every activation patch, from one backward pass.

Patching head ``h``'s ``z`` from a reference run into this run moves a metric by about

    AtP(h) = sum over batch and positions of (z_ref - z) . d metric / d z          (node level)

an exact derivative of the metric along the patch (tested against finite differences to 1e-6 in
float64); how well it predicts the real patch is a separate question, answered by comparing with
:func:`rs_interp.head_ablation_scan` (attention saturation is the usual failure) or refined with
``ig_steps`` (EAP-IG). Edges: :mod:`rs_interp.circuits.edge_attribution`.

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
import torch
from einops import einsum
from jaxtyping import Float, Int

from .._backend import Model
from .._state import preserve_state
from .._stream import RESID0, watched
from ..labels import head_labels
from ..metrics import Metric, top_effects
from ..certificate import require
from ._substrate import IGRule, check_pair, gradient_passes, ig_alphas, outside_inference_mode, record

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
        ig_steps, ig_rule: EAP-IG's ``m`` and its rule (None: plain attribution patching).

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
    ig_steps: int | None = None
    ig_rule: str = "left"

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads with the largest estimated ``|effect|``, with their effect."""
        return top_effects(self.labels, self.effect, k)


@outside_inference_mode
def attribution_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    ig_steps: int | None = None,
    ig_rule: IGRule = "left",
    progress: bool = False,
) -> AttributionPatching:
    """Node-level attribution patching of every head's ``z`` (module docstring): one forward and one
    backward pass on ``tokens``, plus one forward pass on ``reference``.

    Args:
        metric: a :data:`rs_interp.Metric`, differentiable (e.g. :func:`rs_interp.next_token_loss`).
        reference: tokens of the reference run, the shape of ``tokens``.
        ig_steps: ``m`` for EAP-IG (Hanna et al. 2024): the gradient averaged over the ``m`` points
            ``x_ref + (k/m)(x - x_ref)`` on the line from the reference's input embedding (the
            stream entering block 0) to the run's, contracted with the same ``z_ref - z`` as plain
            attribution patching. As ``m`` grows the average tends to the integral of the gradient
            along the line (error O(1/m)). Default: plain (the gradient at the run itself).
        ig_rule: which ``m`` points: ``"left"``, ``k = 0 .. m - 1`` (the reference's endpoint, as
            Hanna et al.'s code: the default), or ``"right"``, ``k = 1 .. m`` (the run's endpoint;
            with ``m = 1`` plain attribution patching).
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
    tokens, reference = check_pair(model, tokens, reference)
    alphas = ig_alphas(ig_steps, ig_rule)
    require(model, "attribution_patching")
    L, n_heads, P = model.cfg.n_layers, model.cfg.n_heads, tokens.shape[1]
    per_pos = torch.zeros(L, n_heads, P, dtype=torch.float64)
    is_z = lambda n: n.endswith("attn.hook_z")  # noqa: E731
    with preserve_state(model):
        ref = record(model, reference, lambda n: is_z(n) or n == RESID0)
        # Plain: the run's own z, read in the pass. IG: the run's z from a pass of its own (the
        # passes run at interpolated inputs).
        clean = record(model, tokens, is_z) if alphas != [1.0] else {}

        def on_z(z: torch.Tensor, *, hook) -> torch.Tensor:
            delta = (ref[hook.name] - (clean[hook.name] if clean else z.detach())).to(torch.float64)
            l = int(hook.name.split(".")[1])

            def contract(grad: torch.Tensor) -> None:
                per_pos[l] += einsum(delta, grad.to(torch.float64), "batch pos head_index d_head, batch pos head_index d_head -> head_index pos")

            return watched(z, contract)

        value = gradient_passes(model, tokens, metric, [(is_z, on_z)], alphas=alphas, x_ref=ref[RESID0], progress=progress)
    per_pos /= len(alphas)
    return AttributionPatching(effect=per_pos.sum(-1), effect_per_position=per_pos, clean=value, labels=head_labels(L, n_heads),
                               ig_steps=ig_steps, ig_rule=ig_rule)
