"""Ablating attention heads at ``hook_z``: zero, mean and resample ablation, and whole-model scans.

A head's write is ``z W_O``; ablating it replaces its ``z`` (batch, pos, d_head) by

- ``"zero"``: 0, so the head writes nothing (the layer's ``b_O`` stays);
- ``"mean"``: its mean over the batch *and the positions* of ``reference`` (default: ``tokens``),
  one vector for every position;
- ``"position_mean"``: its mean over the batch of ``reference`` at each position (``reference`` as
  long as ``tokens``), the mean ablation most circuit analyses use: position-dependent signal stays;
- ``"resample"``: its ``z`` from the run on ``reference`` (same shape as ``tokens``), paired index for
  index (sequence ``b`` of ``tokens`` gets sequence ``b`` of ``reference``'s ``z``, position by
  position; shuffle ``reference`` yourself for random pairs), i.e. activation patching from the
  reference run into this one.

:func:`head_ablation_scan` ablates every head in turn without a full forward pass per head: the
residual stream before layer ``l`` is the clean run's, cached once, so each pass starts at layer
``l``; the heads of a layer share passes, stacked along the batch, as many as fit the memory budget.

>>> from rs_interp import load_toy_model, induction_batch, next_token_loss
>>> model, batch = load_toy_model("induction-2l"), induction_batch(8, seed=0)
>>> scan = head_ablation_scan(model, batch.tokens, next_token_loss(batch.targets))
>>> tuple(scan.effect.shape), scan.ablation, scan.top(1)[0][0]
((2, 2), 'zero', 'L0H0')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model, logit_softcap, run_from
from .._budget import MEMORY_BUDGET, stacked_copies
from .._keywords import renamed, renamed_attribute
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import ONE_PASS_EACH, needs
from ..exact.stream import ablation_values, stacked_start, start_points
from ..exact.validate import Ablation, check_ablation, check_heads, check_int_range, check_positions
from ..hooks import mean_heads, resample_heads, store_matching, zero_heads
from ..labels import head_labels
from ..metrics import Metric, metric_value, top_effects

__all__ = ["ablate_heads", "head_ablation_scan", "HeadAblationScan"]



@dataclass(frozen=True)
class HeadAblationScan:
    """``metric(logits)`` with each head ablated on its own.

    Attributes:
        effect: (layer, head) the change of the metric when that one head is ablated,
            ``ablated - clean``.
        clean: the metric of the clean run.
        ablated: (layer, head) the metric with that one head ablated.
        ablation: ``"zero"``, ``"mean"``, ``"position_mean"`` or ``"resample"``.
        labels: ``"L{l}H{h}"`` per head, row-major (:func:`rs_interp.head_labels`).

    >>> from rs_interp import induction_batch, load_toy_model, next_token_loss
    >>> batch = induction_batch(16, seed=1)
    >>> model = load_toy_model("induction-2l")
    >>> scan = head_ablation_scan(model, batch.tokens, next_token_loss(batch.targets), ablation="mean")
    >>> bool(torch.allclose(scan.effect, scan.ablated - scan.clean)), scan.labels
    (True, ('L0H0', 'L0H1', 'L1H0', 'L1H1'))
    """

    effect: Float[torch.Tensor, "layer head"]
    clean: float
    ablated: Float[torch.Tensor, "layer head"]
    ablation: str
    labels: tuple[str, ...]

    method = renamed_attribute("method", "ablation")

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads whose ablation moves the metric most (largest ``|effect|``), with their effect."""
        return top_effects(self.labels, self.effect, k)


def _reference_z(model: Model, reference: torch.Tensor, ablation: str,
                 layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """Per layer, what ablated heads output: the mean (head, d_head), the per-position mean (pos, head,
    d_head) or the reference z (batch, pos, head, d_head)."""
    if ablation == "zero":
        return {}
    names = {N.z(l) for l in layers}
    values = ablation_values(model, reference, ablation, lambda n: n in names)
    drop = {"mean": (0, 0), "position_mean": (0,)}.get(ablation, ())  # the broadcast axes, as mean_heads takes them
    return {l: values[N.z(l)][drop] for l in layers}


def _hook(ablation: str, value: torch.Tensor | None, head_indices: Sequence[int]) -> Callable:
    if ablation == "zero":
        return zero_heads(head_indices)
    if ablation in ("mean", "position_mean"):
        return mean_heads(value, head_indices)
    return resample_heads(value, head_indices)


@needs("z")
@renamed(method="ablation")
def ablate_heads(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    heads: Sequence[tuple[int, int]],
    *,
    ablation: Ablation = "zero",
    reference: Int[torch.Tensor, "batch pos"] | None = None,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits with ``heads`` ablated together (see the module docstring for the methods).

    Args:
        model: any ``Model``.
        tokens: (batch, pos) token ids.
        heads: ``(layer, head)`` pairs (a bare pair is one head; a head named twice is refused).
        ablation: ``"zero"``, ``"mean"`` (mean over batch and positions of ``reference``, default
            ``tokens``), ``"position_mean"`` (mean over the batch at each position) or
            ``"resample"`` (``z`` from the run on ``reference``, same shape, index for index).
        reference: the reference tokens.

    >>> from rs_interp import load_toy_model, induction_batch
    >>> model, b = load_toy_model(), induction_batch(4, seed=0)
    >>> tuple(ablate_heads(model, b.tokens, [(0, 0)], ablation="mean").shape)
    (4, 48, 256)
    """
    tokens, ref = check_ablation(model, tokens, ablation, reference, "ablate_heads")
    pairs = check_heads(model, heads, "heads", allow_empty=False)
    require(model, "ablate_heads")
    layers = sorted({l for l, _ in pairs})
    with preserve_state(model), torch.no_grad():
        values = _reference_z(model, ref, ablation, layers)
        fwd = [(N.z(l), _hook(ablation, values.get(l), [h for ll, h in pairs if ll == l])) for l in layers]
        with model.hooks(fwd_hooks=fwd):
            return model(tokens, return_type="logits")


def _logits(model: Model, x: torch.Tensor, start: int | None, spe: torch.Tensor | None,
            pos: list[int] | None) -> torch.Tensor:
    """The logits from tokens (``start=None``) or from the stream before layer ``start``; with ``pos``,
    the final norm and the unembedding run at those positions only (both act position by position:
    the certificate's ``readout``)."""
    if pos is None:
        return run_from(model, x, start=start, spe=spe)
    resid = run_from(model, x, start=start, stop=model.cfg.n_layers, spe=spe)[:, pos]
    if model.cfg.normalization_type is not None:
        resid = model.ln_final(resid)
    logits = model.unembed(resid)
    cap = logit_softcap(model)
    return logits if cap is None else cap * torch.tanh(logits / cap)


def _ablate_group(ablation: str, group: list[int], value: torch.Tensor | None, B: int):
    """The hook on ``hook_z`` of a stacked pass: replica ``i`` (rows ``i B`` to ``(i + 1) B``) ablates head
    ``group[i]``."""

    def ablate(z: torch.Tensor, *, hook) -> torch.Tensor:
        out = z.clone()
        for i, h in enumerate(group):
            rows = slice(i * B, (i + 1) * B)
            if ablation == "zero":
                out[rows, :, h] = 0
            elif ablation == "mean":
                out[rows, :, h] = value[h].to(z.dtype)
            elif ablation == "position_mean":
                out[rows, :, h] = value[:, h].to(z.dtype)
            else:
                out[rows, :, h] = value[rows, :, h].to(z.dtype)
        return out

    return ablate


@needs("z", optional={"readout": "positions=", "stop at layer": "positions=", "vocabulary": "positions="},
       adapts=ONE_PASS_EACH)
@renamed(method="ablation")
def head_ablation_scan(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    ablation: Ablation = "zero",
    reference: Int[torch.Tensor, "batch pos"] | None = None,
    positions: Sequence[int] | None = None,
    memory_budget: int = MEMORY_BUDGET,
    progress: bool = True,
) -> HeadAblationScan:
    """The effect on ``metric`` of ablating each head in turn (and the clean and ablated metric).

    Equal to a loop of ``ablate_heads(model, tokens, [(l, h)], ...)`` (tested to 1e-9 in float64)
    but without a full forward pass per head: one clean pass caches the stream before every layer,
    and each layer's heads then run from there, several per pass (stacked along the batch, as
    many as keep the pass's logits and activations under ``memory_budget`` bytes).

    Args:
        metric: a :data:`rs_interp.Metric`, a function of the logits (batch, pos, d_vocab)
            returning a scalar tensor, e.g. :func:`rs_interp.next_token_loss`.
        ablation, reference: as in :func:`ablate_heads`.
        positions: the positions ``metric`` reads; then the logits are computed there only and
            ``metric`` receives (batch, len(positions), d_vocab). At GPT-2 scale the unembedding
            costs as much as five blocks, so a metric of the last position runs about twice as fast.
        memory_budget: bytes one stacked pass may use (roughly); at least one head per pass.
        progress: show a progress bar over the passes.

    >>> from rs_interp import find_prev_token_head, head_label, induction_batch, load_toy_model, next_token_loss
    >>> model, batch = load_toy_model("induction-2l"), induction_batch(50, seed=1)
    >>> scan = head_ablation_scan(model, batch.tokens, next_token_loss(batch.targets), ablation="mean")
    >>> scan.top(1)[0][0] == head_label(*find_prev_token_head(model, batch.tokens))  # the costliest head
    True
    """
    tokens, ref = check_ablation(model, tokens, ablation, reference, "head_ablation_scan")
    check_int_range("memory_budget", memory_budget, 1)
    pos = None if positions is None else check_positions(positions, tokens.shape[1])
    cert = require(model, "head_ablation_scan", also=() if pos is None else ("readout", "stop at layer"))
    # Each pass starts at the ablated layer from the clean stream cached there where running from a
    # layer reproduces the model (the certificate's "start at layer"); else from the tokens.
    from_layer = cert.holds("start at layer")
    cfg = model.cfg
    L, n_heads = cfg.n_layers, cfg.n_heads
    values = torch.full((L, n_heads), float("nan"), dtype=torch.float64)
    box: dict[str, torch.Tensor] = {}
    B, P = tokens.shape
    # Several heads per pass, stacked along the batch, where each row is computed on its own (the
    # certificate's "rows": a hook reading the batch as a whole would see the stack); else one per pass.
    copies = stacked_copies(model, B, P, memory_budget, logit_positions=None if pos is None else len(pos))
    per_pass = min(n_heads, copies)
    per_pass = per_pass if cert.holds("rows") else 1
    with preserve_state(model), torch.no_grad():
        refs = _reference_z(model, ref, ablation, range(L))
        with model.hooks(fwd_hooks=store_matching(box, model, start_points(model))):
            clean = metric_value(metric(_logits(model, tokens, None, None, pos)), "clean run")
        jobs = [(l, list(range(h0, min(h0 + per_pass, n_heads))))
                for l in range(L) for h0 in range(0, n_heads, per_pass)]
        for l, group in bar(jobs, desc="head ablation scan", enabled=progress, unit="pass"):
            k = len(group)
            # replica i ablates head group[i]
            x, start, spe = stacked_start(model, tokens, box, l, k, from_layer)
            value = refs.get(l)
            if ablation == "resample":
                value = value.repeat(k, 1, 1, 1)
            with model.hooks(fwd_hooks=[(N.z(l), _ablate_group(ablation, group, value, B))]):
                logits = _logits(model, x, start, spe, pos)
            for i, h in enumerate(group):
                values[l, h] = metric_value(metric(logits[i * B : (i + 1) * B]), f"head ({l}, {h})")
    return HeadAblationScan(effect=values - clean, clean=clean, ablated=values, ablation=ablation,
                            labels=head_labels(L, n_heads))
