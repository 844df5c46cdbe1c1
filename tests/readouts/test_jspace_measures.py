"""Occupancy and the fraction of variance in J-space (issue 62): a sparse activation occupies as many atoms as it
holds; the pooled fraction is the share of each position's J-space component, recomputed here."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.readouts.jspace import dictionary, sparse_decomposition
from rs_interp.readouts.jspace_measures import estimate_occupancy
from tests.readouts.test_jspace import fitted_model


def test_occupancy_counts_the_atoms_a_sparse_activation_holds():
    D = torch.eye(40, dtype=torch.float64)
    occ = estimate_occupancy(D[2] + D[5] + D[9], D, max_atoms=8, controls=8)
    assert occ.occupancy == 3 and sorted(occ.support[:3].tolist()) == [2, 5, 9]
    assert abs(float(occ.marginal_captured_variance.sum()) - 1) <= 1e-12  # every step's gain: all of x by step 3
    assert occ.top(1)[0][0] in (2, 5, 9)


@pytest.fixture(scope="module")
def fitted():
    return fitted_model()


def test_the_fraction_of_variance_is_the_pooled_share_of_each_position(fitted):
    model, tokens, lens = fitted
    prof = ri.readouts.jspace_variance(model, lens, tokens, [1], k=4, skip_first=7, progress=False)
    _, cache = model.run_with_cache(tokens)
    xs = cache["blocks.1.hook_resid_post"][:, 7:].reshape(-1, 16)
    j = [sparse_decomposition(x, dictionary(model, lens, 1), 4).j_space_component for x in xs]
    num, den = sum(float(v @ v) for v in j), sum(float(x @ x) for x in xs)
    assert prof.layers == (1,) and len(prof.per_position[1]) == 6 and abs(prof.pooled[1] - num / den) <= 1e-12
    assert bool(((prof.per_position[1] >= 0) & (prof.per_position[1] <= 1 + 1e-12)).all())
    assert prof.median[1] == float(prof.per_position[1].median())
