import math

import pytest
import torch

import rs_interp as ri
from rs_interp.reproduce.sections.theorem3 import orthogonal_model


def _dense_theory_score(model, kind, src, dst):
    """The definition, computed densely in float64, pair by pair (the slow way, independently)."""
    (l1, h1), (l2, h2) = src, dst
    W = lambda name, l, h: getattr(model, name)[l, h].detach().double()  # noqa: E731
    ov = W("W_V", l1, h1) @ W("W_O", l1, h1)
    m = {"k": W("W_K", l2, h2), "q": W("W_Q", l2, h2), "v": W("W_V", l2, h2) @ W("W_O", l2, h2)}[kind]
    return float(torch.linalg.norm(ov @ m) / (torch.linalg.norm(ov) * torch.linalg.norm(m)))


@pytest.mark.parametrize("kind", ["k", "q", "v"])
def test_matches_dense_definition(kind, random3x3):
    result = ri.composition_scores(random3x3, kind)
    assert isinstance(result, ri.heads.CompositionScores) and result.which == kind and result.baseline is None
    s = result.scores
    assert s.shape == (3, 3, 3, 3)
    for l1 in range(3):
        for l2 in range(3):
            block = s[l1, :, l2, :]
            if l1 >= l2:
                assert block.isnan().all()
                continue
            for h1 in range(3):
                for h2 in range(3):
                    assert float(block[h1, h2]) == pytest.approx(_dense_theory_score(random3x3, kind, (l1, h1), (l2, h2)), abs=1e-12)


@pytest.mark.parametrize("kind", ["k", "q", "v"])
@pytest.mark.parametrize("shape", [dict(n_layers=2), dict(n_layers=4, d_model=48, n_heads=3, d_head=8)])
def test_full_circuit_matches_transformerlens(kind, shape):
    model = ri.models.make_attn_only(seed=1, **shape)
    ours = ri.composition_scores(model, kind, full_circuit=True).scores
    theirs = model.all_composition_scores(kind.upper())  # TransformerLens spells the kinds in capitals
    upper = ~ours.isnan()
    assert upper.sum() > 0
    assert (ours[upper] - theirs[upper]).abs().max() <= 1e-5


def test_baseline_is_near_one_over_sqrt_d_model(toy2):
    result = ri.composition_scores(toy2, "k", baseline=True)
    assert isinstance(result, ri.heads.CompositionScores)  # one return type, with or without the baseline
    assert abs(result.baseline - 1 / math.sqrt(toy2.cfg.d_model)) < 0.02
    assert torch.equal(result.scores.nan_to_num(-1), ri.composition_scores(toy2, "k").scores.nan_to_num(-1))


def test_k_composition_of_trained_model(toy2, test_set):
    """The table's K-composition row: prev-token head -> each layer-1 head reads as K, not Q or V."""
    ph = ri.find_prev_token_head(toy2, test_set.tokens[:200])
    k, q, v = (ri.composition_scores(toy2, kind).scores[ph][1, :] for kind in "kqv")
    init_k = ri.composition_scores(ri.models.make_attn_only(2, seed=0), "k").scores[0, :, 1, :].max()
    assert (k > torch.maximum(q, v).max()).all()
    assert (k > init_k).all()


@pytest.mark.parametrize("kind", ["X", "K", "Q", "V", "key", None])
def test_unknown_kind(toy2, kind):
    """One spelling: lowercase "q", "k", "v"; TransformerLens's capitals are refused too."""
    for fn in (lambda: ri.composition_scores(toy2, kind), lambda: ri.virtual_weight(toy2, (0, 0), (1, 1), kind)):
        with pytest.raises(ValueError, match="'q', 'k' or 'v'"):
            fn()


def _layer1_pattern(model, tokens, remove_layer0: bool):
    box = {}
    def capture(t, hook):
        box["p"] = t
    hooks = [("blocks.1.attn.hook_pattern", capture)]
    if remove_layer0:
        hooks.append(("blocks.0.hook_attn_out", lambda t, hook: torch.zeros_like(t)))
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    return box["p"]


def test_proposition_4_orthogonal_subspaces(test_set):
    tokens = test_set.tokens[:50]
    model = orthogonal_model(restrict_queries=False)
    assert ri.composition_scores(model, "k").scores[0, :, 1, :].abs().max() < 1e-12
    _, cache = model.run_with_cache(tokens)
    k_x1 = cache["blocks.1.attn.hook_k"]
    k_x0 = torch.einsum("bpd,hde->bphe", cache["blocks.0.hook_resid_pre"], model.blocks[1].attn.W_K) + model.blocks[1].attn.b_K
    assert (k_x1 - k_x0).abs().max() < 1e-12
    with_l0, without_l0 = _layer1_pattern(model, tokens, False), _layer1_pattern(model, tokens, True)
    tv = 0.5 * (with_l0 - without_l0).abs().sum(-1).mean()
    assert tv > 1e-3  # queries still read x_1 (theory: mean total variation 0.104)
    model_q = orthogonal_model(restrict_queries=True)
    diff = (_layer1_pattern(model_q, tokens, False) - _layer1_pattern(model_q, tokens, True)).abs().max()
    assert diff < 1e-12


@pytest.mark.parametrize("kind", ["k", "q", "v"])
def test_virtual_weight_is_low_rank_and_gives_the_composition_score(random3x3, kind):
    """Definition 4: W_OV has rank at most d_head, so the virtual weight does too; its Frobenius
    norm, over the two norms, is the composition score composition_scores computes by QR."""
    from rs_interp.heads.composition import score_from_virtual_weight

    scores = ri.composition_scores(random3x3, kind).scores
    d_head = random3x3.cfg.d_head
    for src, dst in [((0, 1), (1, 2)), ((0, 0), (2, 1)), ((1, 2), (2, 0))]:
        vw = ri.virtual_weight(random3x3, src, dst, kind)
        dense = random3x3.W_V[src] @ random3x3.W_O[src] @ (random3x3.W_K[dst] if kind == "k" else random3x3.W_Q[dst] if kind == "q"
                                                            else random3x3.W_V[dst] @ random3x3.W_O[dst])
        assert (vw.AB - dense).abs().max() <= 1e-12
        assert int(torch.linalg.matrix_rank(dense.detach())) <= d_head
        assert score_from_virtual_weight(random3x3, src, dst, kind) == pytest.approx(float(scores[src + dst]), abs=1e-12)


def test_virtual_weight_refuses_a_later_source(toy2):
    with pytest.raises(ValueError, match="before"):
        ri.virtual_weight(toy2, (1, 0), (0, 1), "k")
