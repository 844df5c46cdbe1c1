"""Issue 22: attribution patching equals the derivative of the metric along the patch (finite differences)."""

import pytest
import torch

import rs_interp as ri
from conftest import architecture_params, ln1_by_hand as _norm, make_variant, needs_tl3, variant_id

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


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
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


def _resid0(model, toks):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: box.update(x=t.clone()))])
    return box["x"]


def _write(model, clean, refc, sender, toks=None, ref=None):
    """The change of a sender's write, reference minus run (written apart from the library)."""
    if sender == "embed":
        return _resid0(model, ref) - _resid0(model, toks)
    if sender.startswith("MLP"):
        name = f"blocks.{int(sender[3:])}.hook_mlp_out"
        return refc[name] - clean[name]
    l, h = (int(x) for x in sender[1:].split("H"))
    name = f"blocks.{l}.attn.hook_z"
    return (refc[name] - clean[name])[:, :, h] @ model.blocks[l].attn.W_O[h]


def _edge_derivative(model, toks, receiver, w):
    """d metric / d eps with ``eps w`` added to one receiver's input only."""
    if receiver == "logits":
        return _derivative(model, toks, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", lambda t, eps: t + eps * w)
    if receiver.startswith("MLP"):
        model.cfg.use_hook_mlp_in = True
        try:
            return _derivative(model, toks, f"blocks.{int(receiver[3:])}.hook_mlp_in", lambda t, eps: t + eps * w)
        finally:
            model.cfg.use_hook_mlp_in = False
    head, kind = receiver.split(".")
    l, h = (int(x) for x in head[1:].split("H"))
    return _head_input_derivative(model, toks, kind, l, h, w)


def _upstream(sender, receiver):
    """The layout's rule, written out: embed feeds everything; a head or MLP of layer l feeds later
    layers, the logits, and (a head) its own layer's MLP."""
    if sender == "embed" or receiver == "logits":
        return True
    ls = int(sender[1:].split("H")[0]) if sender.startswith("L") else int(sender[3:])
    lr = int(receiver[1:].split("H")[0]) if receiver.startswith("L") else int(receiver[3:])
    return ls < lr or (ls == lr and sender.startswith("L") and receiver.startswith("MLP"))


EDGES = [("embed", "L0H1.q"), ("embed", "L2H0.k"), ("L0H1", "L2H0.q"), ("L1H0", "L2H1.k"), ("L0H0", "L1H1.v"),
         ("embed", "logits"), ("L2H1", "logits")]
MLP_EDGES = [("MLP0", "L1H0.k"), ("MLP1", "logits"), ("L1H0", "MLP1"), ("MLP0", "MLP2"), ("embed", "MLP0"), ("MLP1", "L2H1.v")]


#: Every normalisation for the edge estimates: where a layer's projection gradient is taken back
#: through its LayerNorm by hand (HookedTransformer's and 4.x's native attention), each kind has its own formula.
EDGE_VARIANTS = [*VARIANTS, ("RMS", "standard", False), ("LNPre", "rotary", True), (None, "standard", False)]


@pytest.mark.parametrize("variant", EDGE_VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_edge_estimates_are_directional_derivatives(variant):
    model, toks, ref, clean, refc = _setup(variant)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    for sender, receiver in EDGES + ([] if model.cfg.attn_only else MLP_EDGES):
        want = _edge_derivative(model, toks, receiver, _write(model, clean, refc, sender, toks, ref))
        assert eap.edge(sender, receiver) == pytest.approx(want, abs=1e-6), (sender, receiver)
    rule = torch.tensor([[_upstream(s, r) for r in eap.layout.receivers] for s in eap.layout.senders])
    assert torch.equal(eap.layout.exists, rule) and torch.equal(eap.effect.isnan(), ~rule)
    with pytest.raises(ValueError, match="not an edge"):
        eap.edge("L2H0", "L1H0.q")


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_a_senders_edges_sum_to_its_node_estimate(variant):
    """Every reader of the stream is a receiver (per-head q/k/v inputs, the MLP input, the final
    stream), so the derivative along a sender's whole write is the sum over its outgoing edges: the
    node estimate for a head, a directional derivative at the sender's output for embed and MLPs."""
    model, toks, ref, clean, refc = _setup(variant)
    atp = ri.attribution_patching(model, toks, metric, reference=ref)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    totals = dict(zip(eap.layout.senders, eap.sender_totals().tolist()))
    heads = torch.tensor([[totals[f"L{l}H{h}"] for h in range(2)] for l in range(3)], dtype=torch.float64)
    assert (atp.effect - heads).abs().max() <= 1e-9
    assert atp.clean == pytest.approx(eap.clean, abs=1e-12)
    w = _write(model, clean, refc, "embed", toks, ref)
    assert totals["embed"] == pytest.approx(_derivative(model, toks, "blocks.0.hook_resid_pre", lambda t, eps: t + eps * w), abs=1e-6)
    if not model.cfg.attn_only:
        w = _write(model, clean, refc, "MLP1")
        assert totals["MLP1"] == pytest.approx(_derivative(model, toks, "blocks.1.hook_mlp_out", lambda t, eps: t + eps * w), abs=1e-6)


def _interpolated(model, toks, ref, alpha):
    """A hook putting the stream entering block 0 at x_ref + alpha (x - x_ref) (written apart)."""
    x_ref = _resid0(model, ref)
    return ("blocks.0.hook_resid_pre", lambda t, hook: x_ref + alpha * (t - x_ref))


@pytest.mark.parametrize("rule", ["left", "right"])
@pytest.mark.parametrize("variant", VARIANTS[:2], ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_ig_steps_follow_the_definition(variant, rule):
    """EAP-IG with m = 3: each estimate is the mean over k = 0..2 (``"left"``, Hanna et al.'s code) or
    k = 1..3 (``"right"``) of the derivative along the patch at the input x_ref + (k/3)(x - x_ref), the
    patch direction fixed (the clean run's); m = 1 with the right rule is plain attribution patching."""
    model, toks, ref, clean, refc = _setup(variant)
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
            return float(metric(model.run_with_hooks(toks, fwd_hooks=[_interpolated(model, toks, ref, alpha), (name, add)])))

    want = sum((at(k / m, EPS) - at(k / m, -EPS)) / (2 * EPS) for k in ks) / m
    assert float(atp.effect[1, 0]) == pytest.approx(want, abs=1e-6)
    # an edge, through a receiver's input at each interpolated point
    w = _write(model, clean, refc, "L0H1")
    attn = model.blocks[2].attn

    def at_edge(alpha, eps):
        box = {}

        def project(t, hook):
            t = t.clone()
            t[:, :, 0] = _norm(model, 2, box["x"] + eps * w) @ attn.W_K[0] + attn.b_K[0]
            return t
        hooks = [_interpolated(model, toks, ref, alpha), ("blocks.2.hook_resid_pre", lambda t, hook: box.update(x=t)),
                 ("blocks.2.attn.hook_k", project)]
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=hooks)))

    want = sum((at_edge(k / m, EPS) - at_edge(k / m, -EPS)) / (2 * EPS) for k in ks) / m
    assert eap.edge("L0H1", "L2H0.k") == pytest.approx(want, abs=1e-6)
    assert eap.ig_steps == m and eap.ig_rule == rule and eap.clean == pytest.approx(plain.clean, abs=1e-12)


@pytest.mark.parametrize("rule", ["left", "right"])
def test_ig_embed_total_converges_to_the_change_of_the_metric(rule):
    """Completeness: the embedding sender's edges sum to the gradient along the whole input, so with
    IG their total tends to metric(reference) - metric(run) as m grows (a left or right Riemann sum: O(1/m))."""
    model, toks, ref, _, _ = _setup(("LN", "standard", False))
    with torch.no_grad():
        exact = float(metric(model(ref))) - float(metric(model(toks)))
    err = {}
    for m in (8, 64):
        eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=m, ig_rule=rule)
        err[m] = abs(float(eap.sender_totals()[0]) - exact)
    assert err[64] <= err[8] / 4, (err, exact)  # measured: 5.4x smaller (left), 10x (right)


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
    model = ri.make_attn_only(1).to("meta")  # shapes only, as after init_empty_weights
    toks = torch.zeros(1, 4, dtype=torch.long)
    for call in (lambda: ri.attribution_patching(model, toks, lambda lg: lg.sum(), reference=toks),
                 lambda: ri.head_ablation_scan(model, toks, lambda lg: lg.sum()),
                 lambda: ri.copying_scores(model), lambda: ri.composition_scores(model, "k")):
        with pytest.raises(ValueError, match="meta device"):
            call()
