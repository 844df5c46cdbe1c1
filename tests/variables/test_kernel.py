"""The projection kernel against the principal angles written out (an SVD of U^T V), its invariance to the
bases chosen inside each subspace, its bounds, the random-subspace moments against sampling, and, under
TransformerLens 4.3, its own ``projection_kernel`` and ``random_projection_kernel_moments``."""

from __future__ import annotations

import importlib

import pytest
import torch

from rs_interp import _backend
from rs_interp.variables import projection_kernel, random_basis, random_kernel_moments

TL4 = _backend.TL_MAJOR >= 4


def _rotated(basis: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q = torch.linalg.qr(torch.randn(basis.shape[1], basis.shape[1], generator=g, dtype=basis.dtype))[0]
    return basis @ q


@pytest.mark.parametrize("dim, r, s", [(10, 3, 3), (12, 2, 5), (8, 8, 4)])
def test_the_kernel_is_the_squared_cosines_of_the_principal_angles(dim, r, s):
    a, b = random_basis(dim, r, seed=1, dtype=torch.float64), random_basis(dim, s, seed=2, dtype=torch.float64)
    pk = projection_kernel(a, b)
    cos = torch.linalg.svdvals(a.T @ b)
    assert abs(float(pk.score) - float(cos.square().sum())) < 1e-12
    assert abs(float(pk.normalized) - float(pk.score) / (r * s) ** 0.5) < 1e-15
    assert 0 <= float(pk.score) <= min(r, s) + 1e-12
    assert abs(float(projection_kernel(_rotated(a, 3), _rotated(b, 4)).score) - float(pk.score)) < 1e-12  # invariant


def test_containment_and_orthogonality_are_the_bounds():
    e = torch.eye(6, dtype=torch.float64)
    assert float(projection_kernel(e[:, :2], e[:, :4]).score) == 2.0
    assert float(projection_kernel(e[:, :2], e[:, 2:5]).score) == 0.0
    with pytest.raises(ValueError, match="not orthonormal"):
        projection_kernel(2 * e[:, :2], e[:, :2])
    with pytest.raises(ValueError, match="rows"):
        projection_kernel(e[:, :2], torch.eye(5, dtype=torch.float64)[:, :2])


def test_the_random_moments_match_sampling():
    dim, r, n = 10, 3, 3000
    m = random_kernel_moments(dim, r)
    g = torch.Generator().manual_seed(0)
    u = torch.linalg.qr(torch.randn(n, dim, r, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(n, dim, r, generator=g, dtype=torch.float64))[0]
    samples = (u.transpose(-1, -2) @ v).square().sum((-1, -2))
    assert abs(float(samples.mean()) - m.mean) < 4 * (m.variance / n) ** 0.5
    assert abs(float(samples.var()) / m.variance - 1) < 0.15
    with pytest.raises(ValueError, match="rank"):
        random_kernel_moments(4, 5)


@pytest.mark.skipif(not TL4, reason="TransformerLens 4.3's tools.analysis.projection_kernel (not in 3.x)")
def test_side_by_side_with_transformerlens():
    tl = importlib.import_module("transformer_lens.tools.analysis.projection_kernel")
    for dim, r, s in [(10, 3, 3), (16, 2, 5)]:
        a, b = random_basis(dim, r, seed=5, dtype=torch.float64), random_basis(dim, s, seed=6, dtype=torch.float64)
        theirs = tl.projection_kernel(tl.orthonormal_subspace(a), tl.orthonormal_subspace(b))
        mine = projection_kernel(a, b)
        assert abs(float(mine.score) - float(theirs.score)) < 1e-13
        assert torch.allclose(mine.cosines, theirs.cosines, atol=1e-13)
        t, m = tl.random_projection_kernel_moments(dim, r), random_kernel_moments(dim, r)
        assert (t.mean, t.variance) == (m.mean, m.variance)
