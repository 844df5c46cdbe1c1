"""The trainable orthonormal basis of DAS, written out as PyTorch's ``orthogonal`` parametrisation computes it.

TransformerLens 4.3's ``LearnedSubspace`` is
``torch.nn.utils.parametrizations.orthogonal(nn.Linear(rank, d, bias=False))``. Registering it draws the completion
of the initial weight from the global random generator; its forward map is then ``base @ Q(X)``: ``base`` a (d, d)
orthogonal matrix fixed at registration, ``X`` the (d, rank) parameter (``-I`` at the start), ``Q`` the first
``rank`` columns of a product of Householder reflections built from ``X``'s strictly lower triangle (``rank < d``),
or ``matrix_exp(tril(X) - tril(X)^T)`` (``rank = d``). Written here with the same operations in the same order, from
a ``base`` given or drawn by the caller's own generator, so that from the same ``base`` the bases, and the losses of
a training run, are the same floats as TransformerLens's, and the global random state is never read or moved.
"""

from __future__ import annotations

import torch
from torch import nn

__all__: list[str] = []


def make_orthogonal(a: torch.Tensor) -> torch.Tensor:
    """The Q of ``a``'s QR decomposition with the signs of R's diagonal (PyTorch's ``_make_orthogonal``)."""
    x, tau = torch.geqrf(a)
    q = torch.linalg.householder_product(x, tau)
    return q * x.diagonal(dim1=-2, dim2=-1).sgn().unsqueeze(-2)


def completed(basis: torch.Tensor | None, dim: int, rank: int, generator: torch.Generator) -> torch.Tensor:
    """A (dim, dim) orthogonal ``base`` whose first ``rank`` columns span ``basis`` (drawn at random where
    None): a given (dim, dim) orthogonal matrix is used as it is (TransformerLens's ``base``, to start
    from the same point); a (dim, rank) basis is completed by Gaussian columns, then orthogonalised."""
    if basis is not None and basis.shape == (dim, dim):
        return basis.detach().to(torch.float32).clone()
    start = torch.randn(dim, rank, generator=generator) if basis is None else basis.detach().to(torch.float32)
    extra = torch.randn(dim, dim - rank, generator=generator)
    return make_orthogonal(torch.cat([start, extra], dim=-1))


class OrthogonalBasis(nn.Module):
    """A (dim, rank) basis that stays orthonormal while its parameter trains (module docstring)."""

    def __init__(self, base: torch.Tensor, rank: int) -> None:
        super().__init__()
        dim = base.shape[0]
        self.register_buffer("base", base)
        weight = torch.zeros(dim, rank, dtype=base.dtype)
        weight.diagonal().fill_(-1.0)
        self.weight = nn.Parameter(weight)

    def forward(self) -> torch.Tensor:
        x = self.weight
        n, k = x.shape
        if n == k:
            low = x.tril()
            q = torch.matrix_exp(low - low.mH)
        else:
            a = x.tril(diagonal=-1)
            tau = 2.0 / (1.0 + (a * a).sum(dim=-2))
            q = torch.linalg.householder_product(a, tau)
            q = q * x.diagonal(dim1=-2, dim2=-1).int().unsqueeze(-2)
        return self.base @ q
