"""Theorem 3, the exact path expansion of attention-only logits, and its attribution to paths.

For an attention-only model (no LayerNorm, no MLP), with ``A^{lh}`` the attention patterns of
the forward pass,

    x_L W_U = sum over paths of  A^{l_m h_m} ... A^{l_1 h_1} x_0 W_OV^{l_1 h_1} ... W_OV^{l_m h_m} W_U,

a path being the empty path (the direct path ``x_0 W_U``) or a chain of heads with strictly
increasing layers: ``(1 + H)^L`` of them. Biases enter as their own terms (``b_V`` and ``b_O``
as a constant written by each layer, then carried by later heads like ``x_0``; ``b_U`` at the
end), so the contributions always sum to the logits. The expansion is exact *given the
patterns*: it is linear in the values, not in the attention.

For models with LayerNorm and MLPs use :func:`rs_interp.direct_logit_attribution` (first order) and
:func:`rs_interp.second_order_attribution`, exact with the LayerNorm scales frozen.

>>> from rs_interp import load_toy_model, induction_batch, next_token_targets
>>> model = load_toy_model("induction-2l")
>>> tokens = induction_batch(2, seed=0).tokens
>>> pe = path_expansion(model, tokens, targets=next_token_targets(tokens))
>>> len(pe.labels), tuple(pe.contributions.shape)
(9, (9, 2, 48))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int

from .. import _names as N
from .._backend import Model, attn_weight
from .._state import preserve_state
from ..exact.certificate import confirm, require
from ..exact.needs import needs
from ..exact.readout import compute_dtype, d_vocab_out, unembed_bias
from ..exact.validate import check_target_pair, check_tokens
from ..hooks import store_matching
from ..labels import head_label
from ..metrics import top_effects

__all__ = [
    "PathExpansion",
    "path_expansion",
    "PathAttribution",
    "path_logit_attribution",
]

DIRECT = "direct"


@dataclass(frozen=True)
class PathExpansion:
    """Contributions of every path to the logits.

    Attributes:
        labels: one label per path: ``"direct"``, ``"L0H1"``, ``"L0H1>L1H0"``; bias terms
            ``"bias L0"``, ``"bias L0>L1H1"``, ``"b_U"`` appear only when those biases are nonzero.
        contributions: (path, batch, pos, d_vocab), or (path, batch, pos) for the ``targets``
            (0 where a target is -1).
        chains: per path, the (layer, head) pairs it passes through, in order (empty for the
            direct path and the biases).
        targets: the target token ids (-1: skipped), or None for the full vocabulary.
        layers: per path, the layer that wrote its last term (see :meth:`last_layer`).

    >>> from rs_interp import induction_batch, load_toy_model
    >>> pe = path_expansion(load_toy_model("induction-2l"), induction_batch(1, seed=0).tokens)
    >>> pe.labels[:4], pe.chains[3], pe.last_layer().tolist()[:4]
    (('direct', 'L0H0', 'L0H1', 'L1H0'), ((1, 0),), [-1, 0, 0, 1])
    """

    labels: tuple[str, ...]
    contributions: torch.Tensor
    chains: tuple[tuple[tuple[int, int], ...], ...]
    targets: torch.Tensor | None
    layers: tuple[int, ...] = ()

    def total(self) -> torch.Tensor:
        """The sum over paths: the model's logits (at the targets, if given)."""
        return self.contributions.sum(0)

    def last_layer(self) -> torch.Tensor:
        """(path,) the layer that wrote each path's last term: its last head's layer, a bias
        term's own layer (``"bias L0"`` belongs to layer 0), -1 for the direct path and ``b_U``."""
        return torch.tensor(self.layers)

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` paths with the largest mean ``|contribution|`` (over batch, positions and, without
        targets, the vocabulary), with that mean; at the targets (``targets=``), skipped positions left out."""
        c = self.contributions.abs()
        if self.targets is not None:
            c = c[:, self.targets >= 0]
        return top_effects(self.labels, c.reshape(len(self.labels), -1).mean(-1), k)


def _bias(model: Model, dt: torch.dtype) -> torch.Tensor:
    """``b_U`` in ``dt`` (zeros where the model has none)."""
    b_U = unembed_bias(model, dt)
    return torch.zeros(model.W_U.shape[-1], dtype=dt) if b_U is None else b_U


def _stream_paths(
    model: Model, tokens: torch.Tensor
) -> tuple[list[str], list[tuple], list[int], list[torch.Tensor], torch.Tensor]:
    """Every path's contribution to the final residual stream, (batch, pos, d_model) each.

    Returns labels, head chains, the layer that last wrote each term (-1: the embedding), the
    terms, and the run's own logits (for the sum check). Works for every positional scheme: the
    patterns are taken from the run, and ``x_0`` is what block 0 reads (with the positional
    embedding only where it enters the stream).
    """
    dt = compute_dtype(model)
    box: dict[str, torch.Tensor] = {}
    names = N.every(N.RESID0, N.pattern)
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=store_matching(box, model, names)):
            logits = model(tokens, return_type="logits")
        labels, heads, layers, terms = [DIRECT], [()], [-1], [box[N.RESID0].to(dt)]
        for l in range(model.cfg.n_layers):
            attn = model.blocks[l].attn
            pattern = box[N.pattern(l)].to(dt)  # (batch, head, q, k)
            W_O = attn.W_O.to(dt)
            W_OV = attn_weight(attn, "W_V", model.cfg.n_heads).to(dt) @ W_O  # (head, d_model, d_model)
            new: list[tuple[str, tuple, int, torch.Tensor]] = []
            for label, chain, term in zip(labels, heads, terms):
                for h in range(model.cfg.n_heads):
                    new.append((f"{label}>{head_label(l, h)}" if label != DIRECT else head_label(l, h),
                                chain + ((l, h),), l, pattern[:, h] @ (term @ W_OV[h])))
            # b_V reaches the output as b_V W_O (pattern rows sum to one); with b_O it is a constant
            # written by layer l (so it belongs to layer l), then carried by later heads like x_0.
            bias = (torch.einsum("hd,hdm->m", attn_weight(attn, "b_V", model.cfg.n_heads).to(dt), W_O)
                    + attn_weight(attn, "b_O", model.cfg.n_heads).to(dt))
            if bool(bias.any()):
                new.append((f"bias L{l}", (), l, bias.expand_as(terms[0])))
            for label, chain, layer, term in new:
                labels.append(label)
                heads.append(chain)
                layers.append(layer)
                terms.append(term)
    return labels, heads, layers, terms, logits


@needs("embedding", "stream", "z", "heads", "values", "readout", "vocabulary", refuses=("MLPs or a norm",))
def path_expansion(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    targets: Int[torch.Tensor, "batch pos"] | None = None,
) -> PathExpansion:
    """Theorem 3: the logits as an exact sum over paths (see the module docstring).

    Args:
        model: an attention-only ``Model`` (no LayerNorm, no MLP), any positional
            scheme (the patterns are the run's).
        tokens: (batch, pos) token ids.
        targets: optional (batch, pos) token ids, -1 to skip a position (e.g.
            :func:`rs_interp.next_token_targets`); then each path's logit for that token only,
            computed without ever forming the full vocabulary, and 0 at the skipped positions.

    In float64 the sum equals the logits to ~1e-14 (tested to 1e-10); float16/bfloat16 models
    are expanded in float32. The sum is checked against the run's own logits.

    Raises:
        ValueError: the model has LayerNorm or MLPs; tokens/targets are malformed; or a hook the
            caller attached changed the run, so no sum of paths equals it (the error names it).

    >>> import torch
    >>> from rs_interp import as_dtype, induction_batch, load_toy_model
    >>> model = as_dtype(load_toy_model("induction-2l"), torch.float64)
    >>> tokens = induction_batch(4, seed=0).tokens
    >>> pe = path_expansion(model, tokens)  # (path, batch, pos, d_vocab)
    >>> len(pe.labels), float((pe.total() - model(tokens).detach()).abs().max()) < 1e-10  # (1 + 2)^2 paths, exact
    (9, True)
    """
    tokens = check_tokens(model, tokens)
    require(model, "path_expansion")
    skip = None
    if targets is not None:
        safe, _, skip = check_target_pair(targets, None, tokens, d_vocab_out(model))
        targets = safe.masked_fill(skip, -1)
    labels, heads, layers, terms, logits = _stream_paths(model, tokens)
    dt = terms[0].dtype
    with torch.no_grad():
        stack = torch.stack(terms)  # (path, batch, pos, d_model)
        W_U, b_U_all = model.W_U.to(dt), _bias(model, dt)
        if targets is None:
            out, b_U, run = stack @ W_U, b_U_all, logits
        else:
            safe = targets.clamp(min=0)
            out = (stack * W_U.T[safe]).sum(-1).masked_fill(skip, 0.0)  # skipped: no part, excluded from the check
            b_U = b_U_all[safe].masked_fill(skip, 0.0)
            run = logits.gather(-1, safe[..., None])[..., 0].to(dt).masked_fill(skip, 0.0)
        if bool(b_U_all.any()):
            labels.append("b_U")
            heads.append(())
            layers.append(-1)
            out = torch.cat([out, b_U.expand_as(out[0])[None]])
    confirm("path_expansion", "values", out.sum(0), run, out, model.cfg.dtype)
    return PathExpansion(labels=tuple(labels), contributions=out, chains=tuple(heads), targets=targets,
                         layers=tuple(layers))


@dataclass(frozen=True)
class PathAttribution:
    """Each path's share of the target's centered logit at the positions with a target.

    Attributes:
        labels: path labels (as in :class:`PathExpansion`), ``"b_U"`` last when the model has one.
        centered: (path, n_scored) each path's part of ``logit[target] - mean(logit)`` at the
            positions whose target is not -1 (row-major over batch and pos); they sum to it
            exactly, ``b_U``'s part included.
        share: (path, n_scored) ``centered / centered.sum(0)``.
        last_layer: (path,) the layer that wrote each path's last term: its last head's, a bias
            term's own layer, -1 for the direct path and ``b_U``.
        top1_without_last_layer: fraction of scored positions where the paths that do not end
            in the last layer alone rank the target first.

    >>> from rs_interp import induction_batch, load_toy_model
    >>> batch = induction_batch(16, seed=0)
    >>> att = path_logit_attribution(load_toy_model("induction-2l"), batch.tokens, targets=batch.targets)
    >>> bool(torch.allclose(att.share.sum(0), torch.ones(att.share.shape[1]))), att.top1_without_last_layer < 0.1
    (True, True)
    """

    labels: tuple[str, ...]
    centered: torch.Tensor
    share: torch.Tensor
    last_layer: torch.Tensor
    top1_without_last_layer: float

    def share_ending_in(self, layer: int) -> torch.Tensor:
        """(n_scored,) the summed share of the paths whose last term was written by ``layer``."""
        return self.share[self.last_layer == layer].sum(0)

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` paths with the largest mean ``|part|`` of the centered logit, with their mean part."""
        order = self.centered.abs().mean(-1)
        ranked = top_effects(self.labels, order, k)
        return [(label, float(self.centered[self.labels.index(label)].mean())) for label, _ in ranked]


@needs("embedding", "stream", "z", "heads", "values", "readout", "vocabulary", refuses=("MLPs or a norm",))
def path_logit_attribution(
    model: Model, tokens: Int[torch.Tensor, "batch pos"], *, targets: Int[torch.Tensor, "batch pos"]
) -> PathAttribution:
    """Split the target's centered logit into paths at every position with a target.

    Args:
        model: an attention-only ``Model`` (as :func:`path_expansion`).
        tokens: (batch, pos) token ids.
        targets: (batch, pos) token ids, -1 to skip a position: an induction batch's ``targets``
            (its scored positions), or :func:`rs_interp.next_token_targets`.

    Raises:
        ValueError: the model is not attention-only, every target is -1, or a hook the caller
            attached changed the run.

    >>> from rs_interp import load_toy_model, induction_batch
    >>> batch = induction_batch(16, seed=0)
    >>> att = path_logit_attribution(load_toy_model(), batch.tokens, targets=batch.targets)
    >>> float(att.share_ending_in(1).median()) > 0.8
    True
    """
    tokens = check_tokens(model, tokens)
    require(model, "path_logit_attribution")
    safe, _, skip = check_target_pair(targets, None, tokens, d_vocab_out(model))
    mask = ~skip
    if not bool(mask.any()):
        raise ValueError("targets skips every position (all -1): no scored positions to attribute")
    labels, heads, layers, terms, logits = _stream_paths(model, tokens)
    dt = terms[0].dtype
    with torch.no_grad():
        stack = torch.stack(terms)[:, mask]  # (path, n, d_model)
        correct = safe[mask]  # (n,)
        W_U, b_U = model.W_U.to(dt), _bias(model, dt)
        w = W_U.T[correct] - W_U.mean(1)  # centered unembedding columns, (n, d_model)
        centered = (stack * w).sum(-1)
        last = torch.tensor(layers, device=stack.device)
        if bool(b_U.any()):  # b_U is a term of the logits too: attribute it, so the parts sum exactly
            labels.append("b_U")
            centered = torch.cat([centered, (b_U[correct] - b_U.mean())[None]])
            last = torch.cat([last, last.new_tensor([-1])])
        run = logits[mask].to(dt)
        confirm("path_logit_attribution", "values", centered.sum(0),
                run.gather(-1, correct[:, None])[:, 0] - run.mean(-1), centered, model.cfg.dtype)
        partial = stack[last[: len(stack)] != model.cfg.n_layers - 1].sum(0) @ W_U + b_U
        top1 = float((partial.argmax(-1) == correct).float().mean())
    return PathAttribution(labels=tuple(labels), centered=centered, share=centered / centered.sum(0),
                           last_layer=last, top1_without_last_layer=top1)
