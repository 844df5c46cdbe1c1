"""The bases an interchange acts on: the one orthonormality check (and its refusals), the spans extracted,
the fixed bases against their definitions written out here, and seeded draws that leave the caller's
random state alone."""

from __future__ import annotations

import pytest
import torch

from rs_interp.variables import (
    check_basis,
    mean_difference_basis,
    neuron_basis,
    orthonormal_basis,
    probe_basis,
    random_basis,
    random_neuron_basis,
)


def _span_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    pa, pb = a @ a.T, b @ b.T
    return bool(torch.allclose(pa.double(), pb.double(), atol=1e-5))


@pytest.mark.parametrize("bad, words", [
    (torch.ones(4), "2-D floating"),
    (torch.ones(4, 2, dtype=torch.long), "2-D floating"),
    (torch.eye(4)[:, :2] * 2, "not orthonormal"),
    (torch.eye(3, 4), "rank 4"),
    (torch.full((4, 1), float("nan")), "non-finite"),
])
def test_a_bad_basis_is_refused_saying_what_is_wrong(bad, words):
    with pytest.raises(ValueError, match=words):
        check_basis(bad)


def test_a_basis_of_another_width_is_refused():
    with pytest.raises(ValueError, match="5 rows but the activation it acts on has 4"):
        check_basis(torch.eye(5)[:, :2], 4)


def test_orthonormal_basis_measures_the_rank_and_spans_the_columns():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(10, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 5, generator=g, dtype=torch.float64)
    basis = orthonormal_basis(m)
    assert basis.shape == (10, 3)
    check_basis(basis, 10)
    assert torch.allclose(basis @ basis.T @ m, m, atol=1e-12)  # every column lies in the span
    with pytest.raises(ValueError, match=r"rank must be in \[1, 3\]"):
        orthonormal_basis(m, rank=4)


def test_mean_difference_is_the_centred_class_means_span():
    g = torch.Generator().manual_seed(1)
    acts = torch.randn(30, 6, generator=g, dtype=torch.float64)
    labels = [i % 3 for i in range(30)]
    means = torch.stack([acts[torch.tensor(labels) == c].mean(0) for c in range(3)])
    want = torch.linalg.svd((means - means.mean(0)).T, full_matrices=False)[0][:, :2]  # the centred means (rank 2)
    got = mean_difference_basis(acts, labels)
    assert got.shape == (6, 2) and _span_equal(got, want)
    two = mean_difference_basis(acts[:20], [i % 2 for i in range(20)])
    diff = acts[:20][1::2].mean(0) - acts[:20][0::2].mean(0)
    assert torch.allclose((two[:, 0] @ diff).abs(), diff.norm())
    with pytest.raises(ValueError, match="two classes"):
        mean_difference_basis(acts, [0] * 30)


def test_probe_basis_is_the_weight_directions():
    w = torch.tensor([[3.0, 0.0, 4.0]])
    assert torch.allclose(probe_basis(w)[:, 0].abs(), torch.tensor([0.6, 0.0, 0.8]))
    rows = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert _span_equal(probe_basis(rows), orthonormal_basis((rows - rows.mean(0)).T))


def test_random_bases_are_seeded_and_leave_the_global_state_alone():
    state = torch.get_rng_state()
    a, b = random_basis(12, 4, seed=3), random_basis(12, 4, seed=3)
    n = random_neuron_basis(12, 4, seed=3, exclude=[0, 1, 2])
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, random_basis(12, 4, seed=4))
    check_basis(a, 12)
    picked = n.argmax(0)
    assert set(picked.tolist()).isdisjoint({0, 1, 2}) and torch.equal(n, neuron_basis(12, picked))


def test_neuron_basis_is_the_coordinate_axes():
    assert neuron_basis(5, [4, 1]).T.tolist() == [[0, 0, 0, 0, 1], [0, 1, 0, 0, 0]]
    for bad, words in [([1, 1], "twice"), ([5], r"\[0, 5\)"), ([0.5], "integer"), ([], "at least one")]:
        with pytest.raises(ValueError, match=words):
            neuron_basis(5, bad)
    with pytest.raises(ValueError, match="size must be"):
        random_neuron_basis(4, 3, exclude=[0, 1])
