"""Edge attribution patching (rs_interp.circuits.edge_attribution): each edge estimate is the derivative of
the metric along the sender's write into that receiver's input alone (finite differences, every
normalisation); a sender's edges sum to its node estimate; EAP-IG's embedding total converges."""

import pytest
import torch

import rs_interp as ri
from tests.builders import architecture_params, variant_id
from tests.finite_differences import VARIANTS, derivative, edge_derivative, make_case, metric, upstream, write

EDGES = [("embed", "L0H1.q"), ("embed", "L2H0.k"), ("L0H1", "L2H0.q"), ("L1H0", "L2H1.k"), ("L0H0", "L1H1.v"),
         ("embed", "logits"), ("L2H1", "logits")]


MLP_EDGES = [("MLP0", "L1H0.k"), ("MLP1", "logits"), ("L1H0", "MLP1"), ("MLP0", "MLP2"), ("embed", "MLP0"), ("MLP1", "L2H1.v")]


#: Every normalisation for the edge estimates: where a layer's projection gradient is taken back
#: through its LayerNorm by hand (HookedTransformer's and 4.x's native attention), each kind has its own formula.
EDGE_VARIANTS = [*VARIANTS, ("RMS", "standard", False), ("LNPre", "rotary", True), (None, "standard", False)]


@pytest.mark.parametrize("variant", EDGE_VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_edge_estimates_are_directional_derivatives(variant):
    model, toks, ref, clean, refc = make_case(variant)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    for sender, receiver in EDGES + ([] if model.cfg.attn_only else MLP_EDGES):
        want = edge_derivative(model, toks, receiver, write(model, clean, refc, sender, toks, ref))
        assert eap.edge(sender, receiver) == pytest.approx(want, abs=1e-6), (sender, receiver)
    rule = torch.tensor([[upstream(s, r) for r in eap.layout.receivers] for s in eap.layout.senders])
    assert torch.equal(eap.layout.exists, rule) and torch.equal(eap.effect.isnan(), ~rule)
    with pytest.raises(ValueError, match="not an edge"):
        eap.edge("L2H0", "L1H0.q")


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_a_senders_edges_sum_to_its_node_estimate(variant):
    """Every reader of the stream is a receiver (per-head q/k/v inputs, the MLP input, the final
    stream), so the derivative along a sender's whole write is the sum over its outgoing edges: the
    node estimate for a head, a directional derivative at the sender's output for embed and MLPs."""
    model, toks, ref, clean, refc = make_case(variant)
    atp = ri.attribution_patching(model, toks, metric, reference=ref)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    totals = dict(zip(eap.layout.senders, eap.sender_totals().tolist()))
    heads = torch.tensor([[totals[f"L{l}H{h}"] for h in range(2)] for l in range(3)], dtype=torch.float64)
    assert (atp.effect - heads).abs().max() <= 1e-9
    assert atp.clean == pytest.approx(eap.clean, abs=1e-12)
    w = write(model, clean, refc, "embed", toks, ref)
    assert totals["embed"] == pytest.approx(derivative(model, toks, "blocks.0.hook_resid_pre", lambda t, eps: t + eps * w), abs=1e-6)
    if not model.cfg.attn_only:
        w = write(model, clean, refc, "MLP1")
        assert totals["MLP1"] == pytest.approx(derivative(model, toks, "blocks.1.hook_mlp_out", lambda t, eps: t + eps * w), abs=1e-6)


@pytest.mark.parametrize("rule", ["left", "right"])
def test_ig_embed_total_converges_to_the_change_of_the_metric(rule):
    """Completeness: the embedding sender's edges sum to the gradient along the whole input, so with
    IG their total tends to metric(reference) - metric(run) as m grows (a left or right Riemann sum: O(1/m))."""
    model, toks, ref, _, _ = make_case(("LN", "standard", False))
    with torch.no_grad():
        exact = float(metric(model(ref))) - float(metric(model(toks)))
    err = {}
    for m in (8, 64):
        eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=m, ig_rule=rule)
        err[m] = abs(float(eap.sender_totals()[0]) - exact)
    assert err[64] <= err[8] / 4, (err, exact)  # measured: 5.4x smaller (left), 10x (right)


def test_the_parameters_are_frozen_for_the_passes_alone():
    """The gradient passes run with the parameters frozen (issue 50: no layer input saved for a weight's
    gradient) and leave them as they were: trainable ones trainable, a frozen one frozen, no ``.grad``;
    the estimates are those of a model whose parameters are all frozen by its user, to the bit."""
    model, toks, ref, _, _ = make_case(VARIANTS[0])
    frozen = next(iter(model.parameters()))
    frozen.requires_grad_(False)
    seen = []
    hook = ("blocks.0.hook_resid_pre",  # in the gradient passes (the stream needs a gradient there)
            lambda t, *, hook: seen.append([p.requires_grad for p in model.parameters()]) if t.requires_grad else None)
    with model.hooks(fwd_hooks=[hook]):
        a = ri.edge_attribution_patching(model, toks, metric, reference=ref, progress=False)
    assert seen and not any(seen[-1])  # frozen inside the pass (the last run; the certificate checks the model first)
    assert [p.requires_grad for p in model.parameters()] == [False] + [True] * (len(list(model.parameters())) - 1)
    assert all(p.grad is None for p in model.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    b = ri.edge_attribution_patching(model, toks, metric, reference=ref, progress=False)
    assert torch.equal(a.effect.nan_to_num(0), b.effect.nan_to_num(0))
