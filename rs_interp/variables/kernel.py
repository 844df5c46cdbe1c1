"""The projection kernel between two subspaces, and its moments between random ones.

For orthonormal bases ``U`` (dim, r) and ``V`` (dim, s) the projection kernel is

    PK(U, V) = ||U^T V||_F^2 = tr(P_U P_V) = sum_i cos^2(theta_i),

the sum of the squared cosines of the principal angles: it depends on the two subspaces only (not on the
bases chosen inside them), lies in ``[0, min(r, s)]``, is ``min(r, s)`` when one subspace contains the
other and ``0`` when they are orthogonal. ``normalized = PK / sqrt(r s)`` is the cosine between the two
projections (TransformerLens 4.3's ``projection_kernel``, whose numbers these are to float64 rounding).

Between independent Haar-random subspaces of equal rank ``r`` in ``dim`` dimensions the kernel has mean
``r^2 / dim`` and variance ``2 r^2 (dim - r)^2 / (dim^2 (dim - 1) (dim + 2))`` (:func:`random_kernel_moments`):
idealised reference moments, not p-values for trained weights, whose subspaces are neither independent
nor isotropic.

>>> from rs_interp.variables import random_basis
>>> U = random_basis(10, 3, seed=0)
>>> round(float(projection_kernel(U, U).score), 5), round(float(projection_kernel(U, U[:, :1]).normalized), 4)
(3.0, 0.5774)
>>> random_kernel_moments(10, 3).mean
0.9
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float

from ..exact.validate import as_int
from .bases import check_basis

__all__ = ["ProjectionKernel", "projection_kernel", "KernelMoments", "random_kernel_moments", "clamp_kernel"]


@dataclass(frozen=True)
class ProjectionKernel:
    """The projection kernel of two subspaces (module docstring).

    Attributes:
        score: ``||U^T V||_F^2``, in ``[0, min(rank_a, rank_b)]``.
        normalized: ``score / sqrt(rank_a * rank_b)``.
        cosines: the principal angles' cosines, largest first (``min(rank_a, rank_b)`` of them).
        rank_a, rank_b: the two ranks.

    >>> from rs_interp.variables import neuron_basis
    >>> pk = projection_kernel(neuron_basis(4, [0, 1]), neuron_basis(4, [1, 2, 3]))
    >>> float(pk.score), pk.cosines.tolist()
    (1.0, [1.0, 0.0])
    """

    score: Float[torch.Tensor, ""]
    normalized: Float[torch.Tensor, ""]
    cosines: Float[torch.Tensor, " angle"]
    rank_a: int
    rank_b: int


def clamp_kernel(scores: torch.Tensor, upper: int) -> torch.Tensor:
    """``scores`` clamped to ``[0, upper]`` where they pass it by rounding only (100 eps times ``upper``,
    TransformerLens 4.3's rule); a larger excursion means the bases were not orthonormal.

    Raises:
        ValueError: a score outside the bounds by more than rounding.
    """
    tol = 100 * torch.finfo(scores.dtype).eps * max(1, upper)
    low, high = float(scores.min()), float(scores.max())
    if low < -tol or high > upper + tol:
        raise ValueError(f"a projection kernel lies outside [0, {upper}]: [{low:.6g}, {high:.6g}] "
                         f"(tolerance {tol:.2g}): the bases are not orthonormal")
    return scores.clamp(0.0, float(upper))


def projection_kernel(a: Float[torch.Tensor, "dim r"], b: Float[torch.Tensor, "dim s"]) -> ProjectionKernel:
    """The projection kernel of the spans of the orthonormal bases ``a`` and ``b`` (module docstring),
    in float64 where both are float64, else float32.

    Raises:
        ValueError: a basis that is not orthonormal, or bases of different ``dim``.
    """
    check_basis(a, name="a")
    check_basis(b, a.shape[0], name="b")
    dtype = torch.float64 if a.dtype == b.dtype == torch.float64 else torch.float32
    overlap = a.detach().to(dtype).T @ b.detach().to(a.device, dtype)
    rank_a, rank_b = a.shape[1], b.shape[1]
    score = clamp_kernel(overlap.square().sum(), min(rank_a, rank_b))
    cosines = torch.linalg.svdvals(overlap).clamp(0.0, 1.0)
    return ProjectionKernel(score=score, normalized=score / math.sqrt(rank_a * rank_b), cosines=cosines,
                            rank_a=rank_a, rank_b=rank_b)


@dataclass(frozen=True)
class KernelMoments:
    """The projection kernel's mean and variance between independent Haar-random rank-``rank`` subspaces
    of a ``dim``-dimensional space (module docstring).

    >>> m = random_kernel_moments(768, 64)
    >>> round(m.mean, 3), round(m.variance ** 0.5, 3)
    (5.333, 0.108)
    """

    dim: int
    rank: int
    mean: float
    variance: float


def random_kernel_moments(dim: int, rank: int) -> KernelMoments:
    """:class:`KernelMoments` of rank-``rank`` subspaces in ``dim`` dimensions (``2 <= dim``, ``1 <= rank <= dim``).

    Raises:
        ValueError: ``dim < 2`` or a rank outside ``[1, dim]``.
    """
    dim, rank = as_int("dim", dim), as_int("rank", rank)
    if dim < 2 or not 1 <= rank <= dim:
        raise ValueError(f"need dim >= 2 and rank in [1, dim], got dim={dim}, rank={rank}")
    variance = 2 * rank**2 * (dim - rank) ** 2 / (dim**2 * (dim - 1) * (dim + 2))
    return KernelMoments(dim=dim, rank=rank, mean=rank**2 / dim, variance=float(variance))
