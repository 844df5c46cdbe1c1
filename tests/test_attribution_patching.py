"""Issue 22: attribution patching equals the derivative of the metric along the patch (finite differences)."""

import pytest
import torch

import rs_interp as ri
from conftest import make_variant, needs_tl3

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


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", False),
            pytest.param((None, "shortformer", True), marks=needs_tl3)]


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
            assert float(atp.effect[l, h]) == pytest.approx(_derivative(model, toks, name, add), abs=1e-6)
    assert atp.effect_per_position.sum(-1).sub(atp.effect).abs().max() <= 1e-12


def _norm(model, layer, x):
    """Layer ``layer``'s first normalisation, written out from the config (apart from the library)."""
    kind, ln = model.cfg.normalization_type, model.blocks[layer].ln1
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    if kind is not None:
        x = x / (x.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
    if kind in ("LN", "RMS"):
        x = x * ln.w
    return x + ln.b if kind == "LN" else x


def _head_input_derivative(model, toks, kind, layer, head, w):
    """d metric / d eps with head ``head``'s ``kind`` (q, k or v) computed from ``resid_pre + eps w``:
    the projection recomputed at ``hook_{kind}`` (before rotary), which both TransformerLens versions have."""
    attn = model.blocks[layer].attn
    W, b = getattr(attn, f"W_{kind.upper()}")[head], getattr(attn, f"b_{kind.upper()}")[head]
    shortformer = model.cfg.positional_embedding_type == "shortformer"

    def at(eps):
        box = {}

        def keep(t, hook):
            box["x"] = t

        def project(t, hook):
            t = t.clone()
            x = box["x"] + eps * w
            if shortformer and kind in "qk":  # shortformer: queries and keys read the positions too
                x = x + box["pos"]
            t[:, :, head] = _norm(model, layer, x) @ W + b
            return t

        hooks = [(f"blocks.{layer}.hook_resid_pre", keep), (f"blocks.{layer}.attn.hook_{kind}", project)]
        hooks += [("hook_pos_embed", lambda t, hook: box.update(pos=t))] if shortformer else []
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=hooks)))
    return (at(EPS) - at(-EPS)) / (2 * EPS)


def _write(model, clean, refc, l, h):
    name = f"blocks.{l}.attn.hook_z"
    return (refc[name] - clean[name])[:, :, h] @ model.blocks[l].attn.W_O[h]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_edge_estimates_are_directional_derivatives(variant):
    model, toks, ref, clean, refc = _setup(variant)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    for kind in "qkv":
        for (ls, hs, ld, hd) in [(0, 1, 2, 0), (1, 0, 2, 1), (0, 0, 1, 1)]:
            want = _head_input_derivative(model, toks, kind, ld, hd, _write(model, clean, refc, ls, hs))
            assert float(eap.effect[kind][ls, hs, ld, hd]) == pytest.approx(want, abs=1e-6), (kind, ls, hs, ld, hd)
    for kind in "qkv":  # NaN exactly where the source is not earlier
        later = torch.tensor([[ls >= ld for ld in range(3)] for ls in range(3)])[:, None, :, None].expand(3, 2, 3, 2)
        assert torch.equal(eap.effect[kind].isnan(), later)
    w = _write(model, clean, refc, 2, 1)
    logit_edge = _derivative(model, toks, "blocks.2.hook_resid_post", lambda t, eps: t + eps * w)
    assert float(eap.effect["logits"][2, 1]) == pytest.approx(logit_edge, abs=1e-6)
    if not model.cfg.attn_only:
        model.cfg.use_hook_mlp_in = True
        try:
            w = _write(model, clean, refc, 1, 0)
            want = _derivative(model, toks, "blocks.1.hook_mlp_in", lambda t, eps: t + eps * w)
        finally:
            model.cfg.use_hook_mlp_in = False
        assert float(eap.effect["mlp"][1, 0, 1]) == pytest.approx(want, abs=1e-6)
        assert bool(eap.effect["mlp"][2, :, 1].isnan().all())


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_a_heads_edges_sum_to_its_node_estimate(variant):
    """Every reader of the stream gets its own copy (per-head q/k/v inputs, the MLP input, the final
    stream), so the derivative along a head's write is the sum over its outgoing edges."""
    model, toks, ref, _, _ = _setup(variant)
    atp = ri.attribution_patching(model, toks, metric, reference=ref)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    total = eap.effect["logits"].clone()
    for kind in "qkv":
        total += eap.effect[kind].nan_to_num(0).sum((2, 3))
    if "mlp" in eap.effect:
        total += eap.effect["mlp"].nan_to_num(0).sum(2)
    assert (atp.effect - total).abs().max() <= 1e-9
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


def test_top_ranks_the_effects(toy2, small_batch):
    """``top(k)`` of node and edge estimates: the k largest |effect|, labelled, NaN edges never picked
    (checked against a sort written here)."""
    toks, ref = small_batch.tokens[:4], small_batch.tokens[4:8]
    atp = ri.attribution_patching(toy2, toks, metric, reference=ref)
    flat = [(lab, float(v)) for lab, v in zip(ri.head_labels(2, 2), atp.effect.flatten())]
    assert atp.top(4) == sorted(flat, key=lambda x: -abs(x[1]))
    eap = ri.edge_attribution_patching(toy2, toks, metric, reference=ref)
    edges = [(f"{s} -> {d} {kind}", float(eap.effect[kind][ls, hs, 1, hd]))
             for kind in "qkv" for ls, hs, s in ((0, 0, "L0H0"), (0, 1, "L0H1")) for hd, d in ((0, "L1H0"), (1, "L1H1"))]
    edges += [(f"{lab} -> logits", float(v)) for lab, v in zip(ri.head_labels(2, 2), eap.effect["logits"].flatten())]
    want = sorted(edges, key=lambda x: -abs(x[1]))[:5]
    assert [lab for lab, _ in eap.top(5)] == [lab for lab, _ in want]
    assert [v for _, v in eap.top(5)] == pytest.approx([v for _, v in want], abs=0)
    assert len(eap.top(100)) == len(edges)  # the NaN entries (no such edge) are left out
