"""Orthonormal bases of the subspaces an interchange acts on: checked, extracted, and the fixed ones.

A basis is a ``(dim, rank)`` tensor ``B`` with orthonormal columns, ``B^T B = I``: the subspace is its
column span and ``B B^T`` the orthogonal projection onto it (the convention of TransformerLens 4.3's
``tools.analysis.interchange``). ``dim`` is the width of the activation the basis lives in:
``d_model`` on the residual stream, ``d_head`` at a head's ``hook_z``, ``d_mlp`` at an MLP's neurons.

- :func:`check_basis`: the one check every helper applies (a 2-D floating tensor, orthonormal to the
  rounding of its dtype, ``rank <= dim``), refusing with a ``ValueError`` that says what is wrong;
- :func:`orthonormal_basis`: the column span of any matrix, its numerical rank measured (an SVD);
- :func:`mean_difference_basis` (the span of the centred class means), :func:`probe_basis` (a linear
  probe's weight directions), :func:`random_basis` (seeded, the baseline any aligned basis should beat),
  :func:`neuron_basis` and :func:`random_neuron_basis` (coordinate axes: MLP neurons, or tracr's
  labelled residual dimensions, and their placebo).

>>> B = random_basis(8, 3, seed=0)
>>> tuple(B.shape), bool(torch.allclose(B.T @ B, torch.eye(3), atol=1e-6))
((8, 3), True)
>>> check_basis(2 * B, 8)  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
ValueError: basis columns are not orthonormal: max |B^T B - I| = 3 (tolerance 9.5e-06); orthonormalise it
(rs_interp.variables.orthonormal_basis)
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch
from jaxtyping import Float, Int

from .._messages import few
from ..exact.validate import as_int

__all__ = ["check_basis", "orthonormal_basis", "mean_difference_basis", "probe_basis", "random_basis", "neuron_basis",
           "random_neuron_basis"]


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other dtype is computed in float32 (linear algebra has no half kernels)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def orthonormality_tolerance(basis: torch.Tensor) -> float:
    """How far ``B^T B`` may be from the identity: TransformerLens 4.3's ``projection_kernel`` check,
    ``10 * max(dim, rank) * eps`` of the basis's computing dtype."""
    return 10 * max(basis.shape) * torch.finfo(_work_dtype(basis.dtype)).eps


def check_basis(basis: object, dim: int | None = None, *, name: str = "basis") -> torch.Tensor:
    """``basis`` if it is an orthonormal ``(dim, rank)`` basis with ``1 <= rank <= dim``.

    Raises:
        ValueError: not a 2-D floating tensor, a non-finite entry, another ``dim`` than the activation's,
            a rank above ``dim`` or of 0, or columns that are not orthonormal (the message gives the gap).
    """
    if not isinstance(basis, torch.Tensor) or basis.ndim != 2 or not basis.is_floating_point():
        got = f"a {basis.ndim}-D {basis.dtype} tensor" if isinstance(basis, torch.Tensor) else type(basis).__name__
        raise ValueError(f"{name} must be a 2-D floating tensor (dim, rank), got {got}")
    rows, rank = basis.shape
    if dim is not None and rows != dim:
        raise ValueError(f"{name} has {rows} rows but the activation it acts on has {dim} dimensions")
    if not 1 <= rank <= rows:
        raise ValueError(f"{name} has rank {rank}: the rank must be in [1, {rows}] (no subspace of a "
                         f"{rows}-dimensional space has more orthonormal directions)")
    if not bool(torch.isfinite(basis).all()):
        raise ValueError(f"{name} holds a non-finite entry")
    work = basis.detach().to(_work_dtype(basis.dtype))
    gap = float((work.T @ work - torch.eye(rank, dtype=work.dtype, device=work.device)).abs().max())
    tol = orthonormality_tolerance(basis)
    if gap > tol:
        raise ValueError(f"{name} columns are not orthonormal: max |B^T B - I| = {gap:.2g} (tolerance {tol:.2g}); "
                         "orthonormalise it (rs_interp.variables.orthonormal_basis)")
    return basis


def orthonormal_basis(matrix: Float[torch.Tensor, "dim width"], *, rank: int | None = None,
                      rtol: float | None = None) -> Float[torch.Tensor, "dim rank"]:
    """An orthonormal basis of the column span of ``matrix`` (its left singular vectors, largest first).

    The numerical rank counts the singular values above ``rtol`` times the largest (default
    ``max(shape) * eps``, TransformerLens 4.3's ``orthonormal_subspace`` rule); ``rank`` keeps the leading
    ``rank`` of them and may not exceed the measured rank.

    Raises:
        ValueError: not a 2-D floating finite tensor, a zero matrix, or ``rank`` above the measured rank.

    >>> orthonormal_basis(torch.tensor([[1.0, 2.0], [0.0, 0.0], [1.0, 2.0]])).shape  # rank 1
    torch.Size([3, 1])
    """
    if not isinstance(matrix, torch.Tensor) or matrix.ndim != 2 or not matrix.is_floating_point() or 0 in matrix.shape:
        raise ValueError(f"matrix must be a non-empty 2-D floating tensor, got "
                         f"{getattr(matrix, 'shape', type(matrix))}")
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError("matrix holds a non-finite entry")
    work = matrix.detach().to(_work_dtype(matrix.dtype))
    left, sv, _ = torch.linalg.svd(work, full_matrices=False)
    tol = max(matrix.shape) * torch.finfo(work.dtype).eps if rtol is None else float(rtol)
    measured = int((sv > sv[0] * tol).sum())
    if measured == 0:
        raise ValueError("matrix has numerical rank 0: it spans no subspace")
    if rank is not None and not 1 <= as_int("rank", rank) <= measured:
        raise ValueError(f"rank must be in [1, {measured}] (the matrix's measured rank), got {rank}")
    return left[:, : measured if rank is None else int(rank)]


def mean_difference_basis(activations: Float[torch.Tensor, "batch dim"], labels: Sequence[Hashable]
                          ) -> Float[torch.Tensor, "dim rank"]:
    """The span of the class means centred on their mean (rank ``n_classes - 1``): for two classes, the
    difference-of-means direction.

    Raises:
        ValueError: fewer than two classes, or a label count other than the rows'.

    >>> acts = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 5.0]])
    >>> mean_difference_basis(acts, ["a", "a", "b"]).abs().flatten().tolist()
    [0.37139081954956055, 0.9284768104553223]
    """
    labels = list(labels)
    if activations.ndim != 2 or len(labels) != activations.shape[0]:
        raise ValueError(f"activations must be (batch, dim) with one label per row: got {tuple(activations.shape)} and "
                         f"{len(labels)} labels")
    classes = list(dict.fromkeys(labels))
    if len(classes) < 2:
        raise ValueError(f"mean_difference_basis needs at least two classes, got {few(classes)}")
    acts = activations.detach().to(_work_dtype(activations.dtype))
    means = torch.stack([acts[torch.tensor([y == c for y in labels])].mean(0) for c in classes])
    return orthonormal_basis((means - means.mean(0)).T, rank=len(classes) - 1)


def probe_basis(weights: Float[torch.Tensor, "rows dim"]) -> Float[torch.Tensor, "dim rank"]:
    """The directions of a linear probe's weights: the weight direction of a binary probe (one row), the
    span of the centred rows (rank ``rows - 1``) of a multi-class one. Undo any input scaling first (a
    probe fit on standardised inputs: divide each weight by its feature's standard deviation).

    >>> probe_basis(torch.tensor([[3.0, 4.0]])).flatten().abs().tolist()
    [0.6000000238418579, 0.800000011920929]
    """
    w = torch.as_tensor(weights)
    if w.ndim != 2 or not w.is_floating_point():
        raise ValueError(f"weights must be a 2-D floating tensor (rows, dim), got {tuple(w.shape)} {w.dtype}")
    if w.shape[0] == 1:
        return orthonormal_basis(w.T, rank=1)
    return orthonormal_basis((w - w.mean(0)).T, rank=w.shape[0] - 1)


def random_basis(dim: int, rank: int, *, seed: int = 0, dtype: torch.dtype = torch.float32
                 ) -> Float[torch.Tensor, "dim rank"]:
    """A seeded random orthonormal basis (Haar-distributed span), drawn by its own ``torch.Generator``
    (the caller's random state is untouched): the baseline any aligned basis should beat, and the
    placebo's subspace.

    >>> bool(torch.equal(random_basis(6, 2, seed=1), random_basis(6, 2, seed=1)))
    True
    """
    dim, rank = as_int("dim", dim), as_int("rank", rank)
    if not 1 <= rank <= dim:
        raise ValueError(f"rank must be in [1, {dim}] (dim), got {rank}")
    g = torch.Generator().manual_seed(as_int("seed", seed))
    return orthonormal_basis(torch.randn(dim, rank, generator=g, dtype=torch.float64), rank=rank).to(dtype)


def _neuron_indices(dim: int, neurons: object, name: str = "neurons") -> Int[torch.Tensor, " k"]:
    index = torch.as_tensor(neurons if not isinstance(neurons, range) else list(neurons))
    if index.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    if index.dtype == torch.bool or index.is_floating_point() or index.is_complex() or index.ndim != 1:
        raise ValueError(f"{name} must be a 1-D list of integer indices, got {index.dtype} of shape "
                         f"{tuple(index.shape)}")
    index = index.long().cpu()
    if bool(((index < 0) | (index >= dim)).any()):
        raise ValueError(f"{name} must lie in [0, {dim}), got {few(index.tolist())}")
    if index.unique().numel() != index.numel():
        raise ValueError(f"{name} names an index twice: {few(index.tolist())}")
    return index


def neuron_basis(dim: int, neurons: Sequence[int] | torch.Tensor, *, dtype: torch.dtype = torch.float32
                 ) -> Float[torch.Tensor, "dim k"]:
    """The coordinate axes ``neurons`` of a ``dim``-wide activation, in the order given: MLP neurons at
    ``hook_post``, or tracr's labelled residual dimensions. Interchanging it sets exactly those
    coordinates to the source's.

    >>> neuron_basis(4, [2, 0]).T.tolist()
    [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    """
    index = _neuron_indices(as_int("dim", dim), neurons)
    if index.numel() == 0:
        raise ValueError("neuron_basis needs at least one index")
    basis = torch.zeros(dim, index.numel(), dtype=dtype)
    basis[index, torch.arange(index.numel())] = 1.0
    return basis


def random_neuron_basis(dim: int, size: int, *, seed: int = 0, exclude: Sequence[int] | torch.Tensor = (),
                        dtype: torch.dtype = torch.float32) -> Float[torch.Tensor, "dim size"]:
    """``size`` coordinate axes drawn at random (its own generator), none of ``exclude``: the placebo of
    :func:`neuron_basis` (a random direction spreads over every neuron, the wrong placebo for a claim
    about neurons).

    >>> random_neuron_basis(10, 3, seed=0, exclude=[0, 1]).argmax(0).min().item() >= 2
    True
    """
    dim = as_int("dim", dim)
    allowed = torch.ones(dim, dtype=torch.bool)
    allowed[_neuron_indices(dim, exclude, "exclude")] = False
    pool = allowed.nonzero().flatten()
    if not 1 <= as_int("size", size) <= len(pool):
        raise ValueError(f"size must be in [1, {len(pool)}] ({dim - len(pool)} of {dim} excluded), got {size}")
    g = torch.Generator().manual_seed(as_int("seed", seed))
    return neuron_basis(dim, pool[torch.randperm(len(pool), generator=g)[:size]], dtype=dtype)
