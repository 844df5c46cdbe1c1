"""J-space (issue 62): the sparse decomposition's identities (its reconstruction is its coordinates times its atoms,
the KKT conditions of its non-negative least squares hold, checked here apart from the solver), exact recovery of a
sparse non-negative combination, occupancy and the fraction of variance, and agreement with TransformerLens 4.3's
own implementation (4.x only)."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.readouts.jspace import dictionary, sparse_decomposition
from rs_interp.readouts.jspace_measures import estimate_occupancy
from tests.builders import TL4, make_variant

tl43 = pytest.mark.skipif(not TL4, reason="TransformerLens 4.3's jacobian_lens_decomposition is the comparison "
                                          "(4.x only)")


def _dictionary(seed=0, atoms=200, d=24, dtype=torch.float64):
    return torch.randn(atoms, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def kkt_holds(D, x, dec, rtol=1e-7):
    """The NNLS conditions over the selected atoms, written out: ``w = D_S (x - reconstruction)`` is 0 on the active
    atoms and at most 0 on the selected ones left at zero; every coordinate positive."""
    w = D[dec.selected_support] @ (x - dec.reconstruction)
    active = torch.isin(dec.selected_support, dec.support)
    scale = rtol * D[dec.selected_support].norm(dim=1) * (x.norm() + dec.reconstruction.norm())
    return bool((dec.coordinates > 0).all() and (w[active].abs() <= scale[active]).all()
                and (w[~active] <= scale[~active]).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_decomposition_is_its_coordinates_times_its_atoms_and_kkt_holds(seed):
    D = _dictionary(seed)
    x = torch.randn(24, generator=torch.Generator().manual_seed(seed + 10), dtype=torch.float64)
    dec = sparse_decomposition(x, D, k=10)
    assert len(dec.support) <= len(dec.selected_support) <= 10 and dec.kkt_gap <= 1
    assert (dec.reconstruction - dec.coordinates @ D[dec.support]).abs().max() <= 1e-12
    assert kkt_holds(D, x, dec)
    assert (dec.j_space_component + dec.non_j_space_component - x).abs().max() <= 1e-12
    assert (D[dec.selected_support] @ dec.non_j_space_component).abs().max() <= 1e-10  # orthogonal to the span
    assert dec.top(2)[0] == (int(dec.support[dec.coordinates.argmax()]), round(float(dec.coordinates.max()), 4))


def test_a_sparse_non_negative_combination_is_recovered():
    D = _dictionary(3, atoms=500, d=64)
    x = 2.0 * D[3] + 0.5 * D[17] + 1.2 * D[100]
    dec = sparse_decomposition(x, D)
    assert sorted(dec.support.tolist()) == [3, 17, 100]
    assert torch.allclose(dec.coordinates[dec.support.argsort()], torch.tensor([2.0, 0.5, 1.2], dtype=torch.float64),
                          atol=1e-10)
    assert dec.non_j_space_component.abs().max() <= 1e-10


def test_gradient_pursuit_is_non_negative_and_never_raises_the_residual():
    D, x = _dictionary(4), torch.randn(24, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    dec = sparse_decomposition(x, D, k=8, algorithm="gradient_pursuit")
    assert dec.algorithm == "gradient_pursuit" and bool((dec.coordinates > 0).all())
    assert (dec.reconstruction - dec.coordinates @ D[dec.support]).abs().max() <= 1e-12
    assert (x - dec.reconstruction).norm() <= x.norm()


def test_bad_inputs_are_refused():
    D = _dictionary()
    with pytest.raises(ValueError, match="algorithm"):
        sparse_decomposition(D[0], D, algorithm="lasso")
    with pytest.raises(ValueError, match="k must be"):
        sparse_decomposition(D[0], D, k=0)
    with pytest.raises(ValueError, match="norm zero"):
        sparse_decomposition(D[0], torch.cat([D, torch.zeros(1, 24, dtype=D.dtype)]))
    with pytest.raises(ValueError, match="length d_model"):
        sparse_decomposition(torch.zeros(5, dtype=D.dtype), D)


def fitted_model():
    """A float64 model of 3 layers and 60 tokens, two prompts of 10 and its lens (shared by the J-space tests)."""
    model = make_variant("LN", "standard", False, n_layers=3, d_vocab=60)
    tokens = torch.randint(0, 60, (2, 10), generator=torch.Generator().manual_seed(0))
    return model, tokens, ri.fit_jacobian_lens(model, tokens, skip_first=2, progress=False)


@pytest.fixture(scope="module")
def fitted():
    return fitted_model()


def test_the_model_helpers_read_the_stream_and_the_lens_vectors(fitted):
    model, tokens, lens = fitted
    D = dictionary(model, lens, 1)
    assert (D - (lens.matrix(1).T @ model.W_U).T).abs().max() <= 1e-12
    _, cache = model.run_with_cache(tokens[:1])
    x = cache["blocks.1.hook_resid_post"][0, 6]
    on_tokens = ri.readouts.jspace_decomposition(model, lens, tokens[0], 1, position=6, k=6)
    on_vector = ri.readouts.jspace_decomposition(model, lens, x, 1, k=6)
    assert torch.equal(on_tokens.support, on_vector.support) and kkt_holds(D, x, on_vector)
    occ = ri.readouts.jspace_occupancy(model, lens, x, 1, max_atoms=4, controls=2)
    want = estimate_occupancy(x, D, max_atoms=4, controls=2)
    assert occ.occupancy == want.occupancy and torch.equal(occ.support, want.support)
    with pytest.raises(ValueError, match="not one of the lens's source layers"):
        ri.readouts.jspace_decomposition(model, lens, x, 2)
    with pytest.raises(ValueError, match="without a position"):
        ri.readouts.jspace_decomposition(model, lens, tokens[0], 1)


@tl43
@pytest.mark.parametrize("ours, theirs", [("omp", "nonnegative_orthogonal_matching_pursuit"),
                                          ("gradient_pursuit", "gradient_pursuit")])
def test_transformer_lens_decomposes_the_same(ours, theirs):
    from transformer_lens.tools.analysis.jacobian_lens_decomposition import estimate_occupancy as tl_occupancy
    from transformer_lens.tools.analysis.jacobian_lens_decomposition import get_sparse_decomposition

    D = _dictionary(7, atoms=300, d=32, dtype=torch.float32)
    for seed in range(3):
        x = torch.randn(32, generator=torch.Generator().manual_seed(seed))
        a, b = sparse_decomposition(x, D, 12, algorithm=ours), get_sparse_decomposition(x, D, 12, algorithm=theirs)
        assert torch.equal(a.support, b.support) and torch.equal(a.selected_support, b.selected_support)
        assert (a.coordinates - b.coordinates).abs().max() <= 1e-5 * b.coordinates.abs().max()
        assert (a.j_space_component - b.j_space_component).abs().max() <= 1e-5 * x.abs().max()
    mine = estimate_occupancy(x, D, max_atoms=6, controls=3)
    tl = tl_occupancy(x, D, max_atoms=6, num_control_dictionaries=3)
    assert mine.occupancy == tl.occupancy and torch.equal(mine.support, tl.support)
    assert (mine.control_captured_variance - tl.control_captured_variance.double()).abs().max() <= 1e-6
