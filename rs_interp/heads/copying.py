"""Copying scores: does a head's OV circuit copy the token it attends to?

The full OV circuit of head ``h`` maps a source token to logits: ``W_E W_V^h W_O^h W_U``, a
``d_vocab x d_vocab`` matrix of rank at most ``d_head``. A copying head (an induction or name-mover
head) raises the logit of the very token it reads, so the circuit has large positive eigenvalues.
The score (Elhage et al. 2021) is

    sum(eigenvalues) / sum(|eigenvalues|)     in [-1, 1],

1 for a pure copier, -1 for a pure suppressor, near 0 for random weights. The nonzero eigenvalues
of ``A B`` (``A = W_E W_V``, ``B = W_O W_U``) are those of ``B A = W_O W_U W_E W_V``, a ``d_head x
d_head`` matrix: with ``W_U W_E`` (``d_model x d_model``) formed once, each head costs two small
products and one small eigendecomposition; no ``d_vocab x d_vocab`` matrix is ever built. As in
TransformerLens, LayerNorms are ignored (the circuit of the weights, not of a run).

>>> from rs_interp import load_toy_model
>>> s = copying_scores(load_toy_model("induction-2l"))
>>> tuple(s.shape), bool((s.abs() <= 1 + 1e-6).all())
((2, 2), True)
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from .._backend import Model, attn_weight
from ..exact.certificate import require
from ..exact.needs import needs

__all__ = ["copying_scores", "ov_eigenvalues"]


def ov_eigenvalues(model: Model) -> torch.Tensor:
    """(layer, head, d_head) complex eigenvalues of each head's full OV circuit ``W_E W_V W_O W_U``
    (its nonzero spectrum, from the ``d_head x d_head`` matrix ``W_O W_U W_E W_V``), in float64."""
    require(model, "copying_scores")
    with torch.no_grad():
        W_E, W_U = model.W_E.to(torch.float64), model.W_U.to(torch.float64)
        UE = W_U @ W_E  # (d_model, d_model), formed once
        inner = model.W_O.to(torch.float64) @ UE @ attn_weight(model, "W_V", model.cfg.n_heads).to(torch.float64)  # (layer, head, d_head, d_head)
        return torch.linalg.eigvals(inner)


@needs("heads", "values", refuses=("post-norm blocks",))
def copying_scores(model: Model) -> Float[torch.Tensor, "layer head"]:
    """``sum(eig) / sum(|eig|)`` of every head's full OV circuit (see the module docstring), float64.

    Equal to ``FactoredMatrix(W_E @ W_V[l, h], W_O[l, h] @ W_U).eigenvalues`` per head (tested to 1e-6).
    A head whose OV circuit is zero (every eigenvalue 0: it neither copies nor suppresses) scores 0.

    >>> from rs_interp import load_toy_model
    >>> s = copying_scores(load_toy_model("induction-2l"))
    >>> tuple(s.shape), bool((s[1] > 0.9).all())  # (layer, head); the induction heads copy
    ((2, 2), True)
    """
    eig = ov_eigenvalues(model)
    total = eig.abs().sum(-1)
    # 0/0 for a zero circuit: its score is 0, not NaN (a NaN would poison a max or a mean over heads)
    return torch.where(total > 0, eig.sum(-1).real / total.clamp(min=torch.finfo(total.dtype).tiny), torch.zeros_like(total))
