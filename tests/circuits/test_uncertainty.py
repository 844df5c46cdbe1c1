"""Issue 44, how far to trust an estimate: per-pair shares against each pair's own estimate, the
standard error, the bootstrap (identical resamples give Jaccard 1; a resample is the estimate on the
resampled pairs), stability across results, the reliability score and screen-flag-fix, and every
registered method run once."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits.correction import fix_unreliable
from rs_interp.circuits.graph import EdgeEffects, edge_layout
from rs_interp.circuits.methods import METHODS
from rs_interp.circuits.uncertainty import bootstrap, jaccard, stability
from tests.builders import make_variant


def metric(logits):
    """A mean over the pairs of each pair's own term: the estimate on one pair is B times its share."""
    return logits[:, -1].log_softmax(-1)[:, 3].mean()


@pytest.fixture(scope="module")
def setup():
    model = make_variant("LN", "standard", False, seed=2, n_layers=2, n_heads=2)
    g = torch.Generator().manual_seed(2)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (5, 8), generator=g) for _ in range(2))
    return model, toks, ref


OPTIONS = [{}, {"correction": "hessian"}, {"qk_fix": True}, {"ig_steps": 2}, {"ig_steps": 2, "ig_rule": "gauss"}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_shares_are_each_pairs_own_estimate(setup, options):
    """Pair b's share, times B, is the estimate computed on pair b alone (the metric a mean over the
    pairs); the shares sum to the estimate; the standard error is their spread, sqrt(B) sd."""
    model, toks, ref = setup
    B = toks.shape[0]
    est = ri.edge_attribution_patching(model, toks, metric, reference=ref, per_example=True, **options)
    node = ri.attribution_patching(model, toks, metric, reference=ref, per_example=True,
                                   **{k: v for k, v in options.items() if k != "qk_fix"})
    alone = torch.stack([ri.edge_attribution_patching(model, toks[b:b + 1], metric, reference=ref[b:b + 1], **options).effect
                         for b in range(B)])
    E = est.layout.exists
    assert (est.per_example * B - alone)[:, E].abs().max() <= 1e-10
    assert (est.per_example.sum(0) - est.effect)[E].abs().max() <= 1e-12
    assert est.per_example[:, ~E].isnan().all()
    assert (est.stderr() - alone.std(0) / B**0.5)[E].abs().max() <= 1e-12
    assert (est.error_bar(3.0) - 3.0 * est.stderr())[E].abs().max() == 0
    node_alone = torch.stack([ri.attribution_patching(model, toks[b:b + 1], metric, reference=ref[b:b + 1],
                                                      **{k: v for k, v in options.items() if k != "qk_fix"}).effect for b in range(B)])
    assert (node.per_example * B - node_alone).abs().max() <= 1e-10


def test_spread_refusals(setup):
    model, toks, ref = setup
    plain = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    with pytest.raises(ValueError, match="per_example=True"):
        plain.stderr()
    with pytest.raises(ValueError, match="correction='hessian'"):
        plain.reliability()
    one = ri.edge_attribution_patching(model, toks[:1], metric, reference=ref[:1], per_example=True)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        one.stderr()
    with pytest.raises(ValueError, match="per_example=True"):
        bootstrap(plain)


def test_identical_pairs_have_no_spread_and_every_resample_agrees(setup):
    """A batch of one pair repeated: every share is the same, the standard error 0, and every bootstrap
    resample is the full sample: top-k Jaccard 1 and inclusion 0 or 1."""
    model, toks, ref = setup
    same = ri.edge_attribution_patching(model, toks[:1].repeat(6, 1), metric, reference=ref[:1].repeat(6, 1), per_example=True)
    E = same.layout.exists
    assert same.stderr()[E].abs().max() <= 1e-12
    boot = bootstrap(same, n_resamples=30, k=5, seed=3)
    assert torch.equal(boot.jaccard, torch.ones(30, dtype=torch.float64)) and boot.mean_jaccard == 1.0
    assert set(boot.inclusion[E].tolist()) == {0.0, 1.0} and int(boot.inclusion[E].sum()) == 5


def test_bootstrap_resamples_are_the_estimate_on_the_resampled_pairs(setup):
    """Given resamples: the identity resample gives the full estimate (Jaccard 1); a drawn one is the
    estimate recomputed on the pairs it drew; the inclusion frequency counts the resamples' top sets."""
    model, toks, ref = setup
    est = ri.edge_attribution_patching(model, toks, metric, reference=ref, per_example=True)
    E = est.layout.exists
    idx = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [4, 4, 1, 0, 2]])
    boot = bootstrap(est, k=4, resamples=idx)
    assert (boot.effect[0] - est.effect)[E].abs().max() <= 1e-12 and float(boot.jaccard[0]) == 1.0
    again = ri.edge_attribution_patching(model, toks[idx[2]], metric, reference=ref[idx[2]])
    assert (boot.effect[2] - again.effect)[E].abs().max() <= 1e-10
    tops = [set(EdgeEffects(est.layout, e, 0.0).ranked()[:4]) for e in boot.effect]
    full = set(est.ranked()[:4])
    assert boot.jaccard.tolist() == pytest.approx([len(full & t) / len(full | t) for t in tops], abs=0)
    counts = torch.zeros(est.layout.n_edges, dtype=torch.float64)
    for t in tops:
        counts[list(t)] += 1
    assert torch.equal(boot.inclusion[E], counts / 3)
    lo, hi = boot.interval(0.9)
    assert bool((lo[E] <= hi[E]).all())
    with pytest.raises(ValueError, match="pair indices"):
        bootstrap(est, resamples=torch.tensor([[0, 5]]))


def test_stability_counts_top_sets(setup):
    model, toks, ref = setup
    layout = edge_layout(model)
    n = layout.n_edges
    base = torch.full(layout.exists.shape, float("nan"), dtype=torch.float64)
    a, b = base.clone(), base.clone()
    a[layout.exists] = torch.arange(n, dtype=torch.float64)  # top 3: the last three edges
    b[layout.exists] = torch.arange(n, dtype=torch.float64).flip(0)  # top 3: the first three
    b[layout.index(layout.edges()[-1])] = 1e6  # and the last edge first
    ra, rb = EdgeEffects(layout, a, 0.0), EdgeEffects(layout, b, 0.0)
    st = stability([ra, rb, ra], k=3)
    ta, tb = set(ra.ranked()[:3]), set(rb.ranked()[:3])
    assert float(st.jaccard[0, 1]) == jaccard(ta, tb) == 1 / 5 and float(st.jaccard[0, 2]) == 1.0
    assert st.mean_jaccard == pytest.approx((1 / 5 + 1.0 + 1 / 5) / 3, abs=1e-15)
    edges = layout.edges()
    assert st.stable_edges(1.0) == [edges[-1]] and len(st.stable_edges(0.3)) == 5
    with pytest.raises(ValueError, match="one model"):
        stability([ra, ri.edge_attribution_patching(ri.models.make_attn_only(1), torch.zeros(1, 3, dtype=torch.long), metric,
                                                    reference=torch.ones(1, 3, dtype=torch.long))])


def test_reliability_and_screen_flag_fix(toy2_f64, small_batch):
    """reliability = |first| / (|first| + |second|), 0 where both vanish; the flagged edges (below the threshold) take
    their exact path patch, the others keep the corrected estimate, and their error bar is 0."""
    toks, ref = small_batch.tokens[:6], small_batch.tokens[6:12]
    m = ri.next_token_loss(small_batch.targets[:6])
    screen = ri.edge_attribution_patching(toy2_f64, toks, m, reference=ref, correction="hessian", per_example=True)
    E = screen.layout.exists
    f, s = screen.first_order[E].abs(), (screen.effect - screen.first_order)[E].abs()
    flat = f + s <= 1e-9 * (f + s).max()
    assert (screen.reliability()[E] - torch.where(flat, 0.0, f / (f + s))).abs().max() <= 1e-15
    fixed = fix_unreliable(toy2_f64, toks, m, screen, reference=ref, threshold=0.5)
    exact = ri.path_patching(toy2_f64, toks, m, reference=ref)
    flagged = (screen.reliability() < 0.5) & E
    assert torch.equal(fixed.fixed, flagged) and 0 < int(flagged.sum()) < screen.layout.n_edges
    assert (fixed.effect - exact.effect)[flagged].abs().max() <= 1e-9
    assert torch.equal(fixed.effect[E & ~flagged], screen.effect[E & ~flagged])
    assert bool((fixed.error_bar()[flagged] == 0).all()) and torch.equal(fixed.error_bar()[E & ~flagged], screen.error_bar()[E & ~flagged])
    none = fix_unreliable(toy2_f64, toks, m, screen, reference=ref, threshold=0.0)
    assert not bool(none.fixed.any()) and torch.equal(none.effect.nan_to_num(7), screen.effect.nan_to_num(7))
    with pytest.raises(ValueError, match="Hessian-corrected"):
        fix_unreliable(toy2_f64, toks, m, exact, reference=ref)


def test_every_registered_method_runs(toy2_f64, small_batch):
    """Each registry entry on a small batch: edge methods score every edge of the graph (finite, NaN
    off it), node methods every head; those with shares return per-pair shares that sum to the score."""
    toks, ref = small_batch.tokens[:3], small_batch.tokens[3:6]
    m = ri.next_token_loss(small_batch.targets[:3])
    layout = edge_layout(toy2_f64)
    for name, method in METHODS.items():
        kw = {"per_example": True} if method.shares else {}
        result = method.run(toy2_f64, toks, m, reference=ref, **kw)
        if method.level == "edge":
            assert bool(result.effect[layout.exists].isfinite().all()) and bool(result.effect[~layout.exists].isnan().all()), name
        elif method.level == "positional":  # every positional edge scored (spans: each position), NaN off the graph
            assert result.effect.shape == (*layout.exists.shape, toks.shape[1]), name
            assert bool(result.effect[result.exists].isfinite().all()) and bool(result.effect[~result.exists].isnan().all()), name
        else:
            assert len(result.labels) == result.effect.numel() == 4 and bool(result.effect.isfinite().all()), name
        if method.shares:
            total = result.per_example.sum(0)
            assert (total - result.effect).nan_to_num(0).abs().max() <= 1e-12, name


def test_a_flat_region_is_flagged():
    """Where the first- and second-order terms both vanish (here: edges into the query and key of a
    head whose pattern is constant, one position), the reliability is 0: an expansion says nothing."""
    model = make_variant(None, "standard", True, seed=0, n_layers=1, n_heads=1)
    g = torch.Generator().manual_seed(0)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (4, 1), generator=g) for _ in range(2))
    m = lambda lg: (lg[:, 0, 1] ** 2).mean()  # noqa: E731
    est = ri.edge_attribution_patching(model, toks, m, reference=ref, correction="hessian")
    rel = est.reliability()
    assert rel[0, est.layout.receivers.index("L0H0.q")] == 0 and rel[0, est.layout.receivers.index("L0H0.k")] == 0
    assert 0 < float(rel[0, est.layout.receivers.index("L0H0.v")]) <= 1
