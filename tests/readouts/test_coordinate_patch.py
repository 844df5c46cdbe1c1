"""Anchored coordinate patching (issue 62): the edit moves the two coordinates as asked and keeps every other
coordinate and the residual exactly; a supplied decomposition must be one of the activation; the live hooks patch
each position as the offline patch does; TransformerLens 4.3 patches the same (4.x only)."""

from __future__ import annotations

import warnings

import pytest
import torch

import rs_interp as ri
from rs_interp.readouts.coordinate_patch import solve_coordinate_patch
from rs_interp.readouts.jspace import dictionary, sparse_decomposition
from tests.builders import TL4
from tests.readouts.test_jspace import fitted_model


def _setup(seed=0):
    D = torch.randn(200, 24, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x = torch.randn(24, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return x, D, sparse_decomposition(x, D, 10)


@pytest.mark.parametrize("mode", ["substitute", "swap"])
@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.0])
def test_the_edit_moves_two_coordinates_and_keeps_the_rest(mode, alpha):
    x, D, dec = _setup()
    source, absent = int(dec.support[0]), next(i for i in range(200) if i not in dec.support.tolist())
    for target in (int(dec.support[1]), absent):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            p = solve_coordinate_patch(x, D, source, target, decomposition=dec, mode=mode, alpha=alpha)
        before, after = p.coordinates_before, p.coordinates_after
        assert any("below 0" in str(w.message) for w in caught) == bool((after < 0).any())  # warned iff
        s, t = p.source_slot, p.target_slot
        edit = before.clone()
        edit[s], edit[t] = (before[t], before[s]) if mode == "swap" else (0.0, before[s])
        assert torch.allclose(after, before + alpha * (edit - before), atol=1e-14, rtol=0)
        assert p.nonedited_max_delta == 0.0 and p.target_was_appended == (target == absent)
        basis = D[p.support_after].T
        assert (p.patched - x - basis @ (after - before)).abs().max() <= 1e-13
        assert (p.patched - basis @ after - (x - dec.reconstruction)).abs().max() <= 1e-12  # the residual kept


def test_alpha_zero_changes_nothing_and_bad_edits_are_refused():
    x, D, dec = _setup(2)
    assert torch.equal(solve_coordinate_patch(x, D, int(dec.support[0]), 5, decomposition=dec, alpha=0.0).patched, x)
    outside = next(i for i in range(200) if i not in dec.support.tolist())
    with pytest.raises(ValueError, match="not in the decomposition's active support"):
        solve_coordinate_patch(x, D, outside, int(dec.support[0]), decomposition=dec)
    with pytest.raises(ValueError, match="same atom"):
        solve_coordinate_patch(x, D, int(dec.support[0]), int(dec.support[0]))
    with pytest.raises(ValueError, match="mode"):
        solve_coordinate_patch(x, D, int(dec.support[0]), 1, mode="move")
    with pytest.raises(ValueError, match="another activation"):
        solve_coordinate_patch(x + 1.0, D, int(dec.support[0]), outside, decomposition=dec)


@pytest.fixture(scope="module")
def fitted():
    return fitted_model()


def test_the_hooks_patch_each_position_as_the_offline_patch(fitted):
    model, tokens, lens = fitted
    _, cache = model.run_with_cache(tokens)
    x = cache["blocks.1.hook_resid_post"]
    D = dictionary(model, lens, 1)
    source = int(sparse_decomposition(x[0, 8], D, 6).support[0])
    if source not in sparse_decomposition(x[1, 8], D, 6).support.tolist():
        tokens, x = tokens[:1], x[:1]
    target = next(t for t in range(60) if t != source)
    cache_of: dict = {}
    seen = {}
    hooks = ri.readouts.coordinate_patch_hooks(model, lens, source, target, [1], positions=[-2],
                                               decomposition_cache=cache_of, k=6, mode="swap")
    with model.hooks(fwd_hooks=hooks + [("blocks.1.hook_resid_post", lambda t, hook: seen.__setitem__("x", t))]):
        model(tokens)
    for b in range(tokens.shape[0]):
        want = ri.readouts.coordinate_patch(model, lens, x[b, 8], 1, source, target, k=6, mode="swap").patched
        assert (seen["x"][b, 8] - want).abs().max() <= 1e-12
        assert torch.equal(seen["x"][b, :8], x[b, :8]) and (1, b, 8) in cache_of
    with pytest.raises(ValueError, match="not in the decomposition's active support"), model.hooks(
            fwd_hooks=ri.readouts.coordinate_patch_hooks(model, lens, target, source, [1], positions=[3], k=1)):
        model(tokens)


@pytest.mark.skipif(not TL4, reason="TransformerLens 4.3's solve_coordinate_patch is the comparison (4.x only)")
@pytest.mark.parametrize("mode", ["substitute", "swap"])
def test_transformer_lens_patches_the_same(mode):
    from transformer_lens.tools.analysis.jacobian_lens_coordinate_patch import solve_coordinate_patch as tl_patch

    D = torch.randn(300, 32, generator=torch.Generator().manual_seed(3))
    x = torch.randn(32, generator=torch.Generator().manual_seed(4))
    source = int(sparse_decomposition(x, D, 10).support[0])
    mine, theirs = solve_coordinate_patch(x, D, source, 7, k=10, mode=mode), tl_patch(x, D, source, 7, k=10, mode=mode)
    assert torch.equal(mine.support_after, theirs.support_after)
    assert (mine.patched - theirs.patched).abs().max() <= 1e-5 * x.abs().max()
