"""Issue 22: attribution patching equals the derivative of the metric along the patch (finite differences)."""

import pytest
import torch

import rs_interp as ri
from conftest import make_variant

EPS = 1e-4  # central differences: error O(EPS^2) ~ 1e-8 on these metrics


def _setup(variant, seed=1):
    model = make_variant(*variant, seed=seed, n_layers=3, n_heads=2)
    g = torch.Generator().manual_seed(seed)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (2, 8), generator=g) for _ in range(2))
    with torch.no_grad():
        _, clean = model.run_with_cache(toks)
        _, refc = model.run_with_cache(ref)
    return model, toks, ref, clean, refc


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 3].mean() + 0.1 * logits[:, 2, 5].sum()


def _derivative(model, toks, hook_name, add):
    """Central difference of the metric with ``add(t, eps)`` applied at ``hook_name``; written apart from the library."""
    def at(eps):
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=[(hook_name, lambda t, hook: add(t, eps))])))
    return (at(EPS) - at(-EPS)) / (2 * EPS)


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", False), (None, "shortformer", True)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_node_estimates_are_directional_derivatives(variant):
    model, toks, ref, clean, refc = _setup(variant)
    atp = ri.attribution_patching(model, toks, metric, reference=ref)
    for l in range(3):
        name = f"blocks.{l}.attn.hook_z"
        d = refc[name] - clean[name]
        for h in range(2):
            def add(t, eps, h=h, d=d):
                t = t.clone()
                t[:, :, h] += eps * d[:, :, h]
                return t
            assert float(atp.values[l, h]) == pytest.approx(_derivative(model, toks, name, add), abs=1e-6)
    assert atp.per_position.sum(-1).sub(atp.values).abs().max() <= 1e-12


def _write(model, clean, refc, l, h):
    name = f"blocks.{l}.attn.hook_z"
    return (refc[name] - clean[name])[:, :, h] @ model.blocks[l].attn.W_O[h]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_edge_estimates_are_directional_derivatives(variant):
    model, toks, ref, clean, refc = _setup(variant)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    model.cfg.use_split_qkv_input = True
    try:
        for kind in "qkv":
            for (ls, hs, ld, hd) in [(0, 1, 2, 0), (1, 0, 2, 1), (0, 0, 1, 1)]:
                w = _write(model, clean, refc, ls, hs)

                def add(t, eps, hd=hd, w=w):
                    t = t.clone()
                    t[:, :, hd] += eps * w
                    return t
                want = _derivative(model, toks, f"blocks.{ld}.hook_{kind}_input", add)
                assert float(eap.values[kind][ls, hs, ld, hd]) == pytest.approx(want, abs=1e-6), (kind, ls, hs, ld, hd)
    finally:
        model.cfg.use_split_qkv_input = False
    for kind in "qkv":  # NaN exactly where the source is not earlier
        later = torch.tensor([[ls >= ld for ld in range(3)] for ls in range(3)])[:, None, :, None].expand(3, 2, 3, 2)
        assert torch.equal(eap.values[kind].isnan(), later)
    w = _write(model, clean, refc, 2, 1)
    logit_edge = _derivative(model, toks, "blocks.2.hook_resid_post", lambda t, eps: t + eps * w)
    assert float(eap.values["logits"][2, 1]) == pytest.approx(logit_edge, abs=1e-6)
    if not model.cfg.attn_only:
        model.cfg.use_hook_mlp_in = True
        try:
            w = _write(model, clean, refc, 1, 0)
            want = _derivative(model, toks, "blocks.1.hook_mlp_in", lambda t, eps: t + eps * w)
        finally:
            model.cfg.use_hook_mlp_in = False
        assert float(eap.values["mlp"][1, 0, 1]) == pytest.approx(want, abs=1e-6)
        assert bool(eap.values["mlp"][2, :, 1].isnan().all())


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_a_heads_edges_sum_to_its_node_estimate(variant):
    """Every reader of the stream gets its own copy (per-head q/k/v inputs, the MLP input, the final
    stream), so the derivative along a head's write is the sum over its outgoing edges."""
    model, toks, ref, _, _ = _setup(variant)
    atp = ri.attribution_patching(model, toks, metric, reference=ref)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    total = eap.values["logits"].clone()
    for kind in "qkv":
        total += eap.values[kind].nan_to_num(0).sum((2, 3))
    if "mlp" in eap.values:
        total += eap.values["mlp"].nan_to_num(0).sum(2)
    assert (atp.values - total).abs().max() <= 1e-9
    assert atp.clean == pytest.approx(eap.clean, abs=1e-12)


def test_no_gradients_left_and_bad_metric(toy2, small_batch):
    toks, ref = small_batch.tokens[:2], small_batch.tokens[2:4]
    ri.attribution_patching(toy2, toks, lambda lg: lg[:, -1, 0].mean(), reference=ref)
    ri.edge_attribution_patching(toy2, toks, lambda lg: lg[:, -1, 0].mean(), reference=ref)
    assert all(p.grad is None for p in toy2.parameters())
    with pytest.raises(ValueError, match="scalar"):
        ri.attribution_patching(toy2, toks, lambda lg: lg[:, -1, 0], reference=ref)
    with pytest.raises(ValueError, match="differentiable"):
        ri.attribution_patching(toy2, toks, lambda lg: lg[:, -1, 0].mean().detach(), reference=ref)
    with pytest.raises(ValueError, match="shape"):
        ri.edge_attribution_patching(toy2, toks, lambda lg: lg.mean(), reference=ref[:1])
