"""Head subspace affinities against the projection kernel written out pair by pair (an SVD of each head's
weight, the squared singular values of U^T V), on the grid's variants (grouped-query heads kept native), in
float64; the factor and projection paths alike; the rank options and refusals; and, under TransformerLens
4.3, its ``attention_head_subspace_affinity`` to float64 rounding."""

from __future__ import annotations

import importlib

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.variables import random_kernel_moments
from tests.builders import architecture_params, make_variant, variant_id

TL4 = _backend.TL_MAJOR >= 4


def _span(w: torch.Tensor) -> torch.Tensor:
    u, s, _ = torch.linalg.svd(w.double(), full_matrices=False)
    return u[:, : int((s > s[0] * 1e-10).sum())]


def brute_force(model, which: str) -> torch.Tensor:
    """Per pair, from each block's own weights: ||U^T V||_F^2, U spanning W_O^T of the earlier head, V the later
    head's W_Q / W_K / W_V (one per key/value head)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n_kv = getattr(model.cfg, "n_key_value_heads", None) or H
    targets = H if which == "q" else n_kv
    out = torch.full((L, H, L, targets), float("nan"), dtype=torch.float64)
    for l1 in range(L):
        W_O = model.blocks[l1].attn.W_O.detach()
        for l2 in range(l1 + 1, L):
            W = getattr(model.blocks[l2].attn, f"W_{which.upper()}").detach()
            if which != "q" and W.shape[0] == H and n_kv != H:  # 3.x repeats each KV head per query head
                W = W[:: H // n_kv]
            for h in range(H):
                for t in range(targets):
                    out[l1, h, l2, t] = torch.linalg.svdvals(_span(W_O[h].T).T @ _span(W[t])).square().sum()
    return out


@pytest.mark.parametrize("variant", [("LN", "standard", False), (None, "rotary", True)] + architecture_params(),
                         ids=lambda v: variant_id(v) if isinstance(v, tuple) else None)
def test_affinity_is_the_projection_kernel_pair_by_pair(variant):
    model = make_variant(*variant, n_layers=3, n_heads=4)
    kinds = "qkv" if ri.certify(model).holds("scores") else "v"
    if kinds == "v":  # qk-norm: the score is no bilinear form of the weights, so OQ and OK are refused by name
        with pytest.raises(ValueError, match="the identity 'scores' fails"):
            ri.head_affinity(model, "k")
    both = ri.head_affinities(model, which=tuple(kinds))
    factors = ri.head_affinities(model, which=tuple(kinds), memory_budget=1)  # the factor products
    for which in kinds:
        want, got = brute_force(model, which), both[which]
        assert got.scores.shape == want.shape and torch.equal(got.scores.isnan(), want.isnan())
        mask = ~want.isnan()
        assert float((got.scores[mask] - want[mask]).abs().max()) < 1e-12
        assert float((factors[which].scores[mask] - want[mask]).abs().max()) < 1e-12
        assert torch.allclose(got.normalized[mask], want[mask] / got.rank)
        assert got.reference == random_kernel_moments(model.cfg.d_model, model.cfg.d_head)
        assert torch.equal(ri.head_affinity(model, which).scores.nan_to_num(), got.scores.nan_to_num())


def test_labels_top_and_ranks():
    model = make_variant(None, "standard", True, "gqa", n_layers=2, n_heads=4)
    k = ri.head_affinity(model, "k")
    assert k.scores.shape == (2, 4, 2, 1) and k.labels[0] == ("L0H0", "L0KV0")
    top = k.top(2)
    assert len(top) == 2 and all(label[0].startswith("L0") and label[1] == "L1KV0" for label, _ in top)
    assert bool((k.source_ranks == 8).all()) and ri.head_affinity(model, "q", rank=3).rank == 3


def test_a_rank_deficient_head_is_refused_unless_truncated():
    model = make_variant(None, "standard", True, n_layers=2)
    with torch.no_grad():
        state = _backend.portable_state(model)
        state["blocks.0.attn.W_O"][1, :4] = 0.0  # head 1 of layer 0 writes from 4 of its 8 dimensions only
        _backend.load_portable_state(model, state)
    with pytest.raises(ValueError, match="layer 0, head 1 has numerical rank 4"):
        ri.head_affinity(model, "v")
    assert ri.head_affinity(model, "v", rank=4).rank == 4
    with pytest.raises(ValueError, match="which must be"):
        ri.head_affinity(model, "Q")


@pytest.mark.skipif(not TL4, reason="TransformerLens 4.3's attention_head_subspace_affinity (not in 3.x)")
@pytest.mark.parametrize("variant", [("LN", "rotary", False, "gqa"), (None, "standard", True, None)])
def test_side_by_side_with_transformerlens(variant):
    tl = importlib.import_module("transformer_lens.tools.analysis.projection_kernel")
    model = make_variant(*variant, n_layers=3, n_heads=4)
    for which in "qkv":
        for rank in (None, 5):
            theirs = tl.attention_head_subspace_affinity(model, target_role=which.upper(), rank=rank)
            mine = ri.head_affinity(model, which, rank=rank)
            mask = theirs.valid_mask
            assert torch.equal(~mine.scores.isnan(), mask)
            assert float((mine.scores[mask] - theirs.scores[mask]).abs().max()) < 1e-12
            assert float((mine.normalized[mask] - theirs.normalized[mask]).abs().max()) < 1e-13
            assert torch.equal(mine.source_ranks, theirs.source_ranks) and torch.equal(mine.target_ranks, theirs.target_ranks)
