"""Node attribution patching (rs_interp.circuits.node_attribution) equals the derivative of the metric along
the patch (finite differences), plain and integrated (EAP-IG's points); the gradient helpers' shared
contract (no gradients left, bad metrics named, inference mode, meta device, ``.top(k)``)."""

import pytest
import torch

import rs_interp as ri
from tests.builders import architecture_params, ln1_by_hand, variant_id
from tests.finite_differences import EPS, VARIANTS, derivative, interpolated, make_case, metric, write


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_node_estimates_are_directional_derivatives(variant):
    model, toks, ref, clean, refc = make_case(variant)
    atp = ri.attribution_patching(model, toks, metric, reference=ref)
    for l in range(3):
        name = f"blocks.{l}.attn.hook_z"
        d = refc[name] - clean[name]
        for h in range(2):
            def add(t, eps, h=h, d=d):
                t = t.clone()
                t[:, :, h] += eps * d[:, :, h]
                return t
            assert float(atp.effect[l, h]) == pytest.approx(derivative(model, toks, name, add), abs=1e-6)
    assert atp.effect_per_position.sum(-1).sub(atp.effect).abs().max() <= 1e-12


@pytest.mark.parametrize("rule", ["left", "right"])
@pytest.mark.parametrize("variant", VARIANTS[:2], ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_ig_steps_follow_the_definition(variant, rule):
    """EAP-IG with m = 3: each estimate is the mean over k = 0..2 (``"left"``, Hanna et al.'s code) or
    k = 1..3 (``"right"``) of the derivative along the patch at the input x_ref + (k/3)(x - x_ref), the
    patch direction fixed (the clean run's); m = 1 with the right rule is plain attribution patching."""
    model, toks, ref, clean, refc = make_case(variant)
    m = 3
    ks = range(m) if rule == "left" else range(1, m + 1)
    atp = ri.attribution_patching(model, toks, metric, reference=ref, ig_steps=m, ig_rule=rule)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=m, ig_rule=rule)
    plain = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    if rule == "right":
        assert torch.equal(ri.attribution_patching(model, toks, metric, reference=ref, ig_steps=1, ig_rule=rule).effect,
                           ri.attribution_patching(model, toks, metric, reference=ref).effect)
        assert torch.equal(ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=1, ig_rule=rule).effect.nan_to_num(7),
                           plain.effect.nan_to_num(7))
    name = "blocks.1.attn.hook_z"
    d = refc[name] - clean[name]

    def at(alpha, eps):
        def add(t, hook):
            t = t.clone()
            t[:, :, 0] += eps * d[:, :, 0]
            return t
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=[interpolated(model, toks, ref, alpha), (name, add)])))

    want = sum((at(k / m, EPS) - at(k / m, -EPS)) / (2 * EPS) for k in ks) / m
    assert float(atp.effect[1, 0]) == pytest.approx(want, abs=1e-6)
    # an edge, through a receiver's input at each interpolated point
    w = write(model, clean, refc, "L0H1")
    attn = model.blocks[2].attn

    def at_edge(alpha, eps):
        box = {}

        def project(t, hook):
            t = t.clone()
            t[:, :, 0] = ln1_by_hand(model, 2, box["x"] + eps * w) @ attn.W_K[0] + attn.b_K[0]
            return t
        hooks = [interpolated(model, toks, ref, alpha), ("blocks.2.hook_resid_pre", lambda t, hook: box.update(x=t)),
                 ("blocks.2.attn.hook_k", project)]
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=hooks)))

    want = sum((at_edge(k / m, EPS) - at_edge(k / m, -EPS)) / (2 * EPS) for k in ks) / m
    assert eap.edge("L0H1", "L2H0.k") == pytest.approx(want, abs=1e-6)
    assert eap.ig_steps == m and eap.ig_rule == rule and eap.clean == pytest.approx(plain.clean, abs=1e-12)


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
    edges = [((s, r), float(eap.effect[i, j])) for i, s in enumerate(eap.layout.senders)
             for j, r in enumerate(eap.layout.receivers) if not eap.effect[i, j].isnan()]
    want = sorted(edges, key=lambda x: -abs(x[1]))[:5]
    assert [lab for lab, _ in eap.top(5)] == [lab for lab, _ in want]
    assert [v for _, v in eap.top(5)] == pytest.approx([v for _, v in want], abs=0)
    assert len(eap.top(1000)) == len(edges) == eap.layout.n_edges == 29  # embed 13, layer 0's heads 2 x 7, layer 1's 2 x 1


def test_inside_inference_mode(toy2, small_batch):
    """A notebook often wraps its cells in torch.inference_mode(): the estimates are the same."""
    toks, ref = small_batch.tokens[:2], small_batch.tokens[2:4]
    m = lambda logits: logits[:, -1, 3].mean()  # noqa: E731
    want = ri.attribution_patching(toy2, toks, m, reference=ref)
    want_edges = ri.edge_attribution_patching(toy2, toks, m, reference=ref)
    with torch.inference_mode():
        got = ri.attribution_patching(toy2, toks.clone(), m, reference=ref.clone())
        edges = ri.edge_attribution_patching(toy2, toks.clone(), m, reference=ref.clone())
    assert torch.equal(got.effect, want.effect)
    assert torch.equal(edges.effect.nan_to_num(7), want_edges.effect.nan_to_num(7))


def test_a_model_on_the_meta_device_is_refused():
    model = ri.models.make_attn_only(1).to("meta")  # shapes only, as after init_empty_weights
    toks = torch.zeros(1, 4, dtype=torch.long)
    for call in (lambda: ri.attribution_patching(model, toks, lambda lg: lg.sum(), reference=toks),
                 lambda: ri.head_ablation_scan(model, toks, lambda lg: lg.sum()),
                 lambda: ri.copying_scores(model), lambda: ri.composition_scores(model, "k")):
        with pytest.raises(ValueError, match="meta device"):
            call()
