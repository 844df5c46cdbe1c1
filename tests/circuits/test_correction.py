"""Issue 44, the second-order (Hessian) correction and Gauss-Legendre EAP-IG: the identity on a
quadratic construction (exact patching to 1e-9), the Hessian term against mixed finite differences
of the metric, the multi-step and Gauss-Legendre rules against their definitions, and the refusal
where autograd cannot differentiate twice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.circuits.correction import gauss_points
from tests.builders import (
    ARCHITECTURES,
    architecture_params,
    grab,
    make_variant,
    needs_tl3,
    patching_metric,
    random_pair,
    sender_write_change,
    variant_id,
)
from tests.builders import ln1_by_hand as _norm

D = 1e-4  # steps of the mixed central differences: truncation O(D^2), rounding ~1e-16 / D^2


metric = patching_metric


_setup = random_pair





def _receiver_hooks(model, receiver, w, eps):
    """Hooks adding ``eps * w`` to one receiver's input (a head's projection recomputed at hook_q/k/v
    from its layer's input, before rotary; an MLP's input; the final stream)."""
    L = model.cfg.n_layers
    if receiver == "logits":
        return [(f"blocks.{L - 1}.hook_resid_post", lambda t, hook: t + eps * w)]
    if receiver.startswith("MLP"):
        return [(f"blocks.{int(receiver[3:])}.hook_mlp_in", lambda t, hook: t + eps * w)]
    head, kind = receiver.split(".")
    l, h = (int(x) for x in head[1:].split("H"))
    attn, box = model.blocks[l].attn, {}
    W = _backend.attn_weight(attn, f"W_{kind.upper()}", model.cfg.n_heads)[h]
    b = _backend.attn_weight(attn, f"b_{kind.upper()}", model.cfg.n_heads)[h]
    short = model.cfg.positional_embedding_type == "shortformer" and kind in "qk"

    def project(t, hook):
        t = t.clone()
        t[:, :, h] = _norm(model, l, box["x"] + eps * w + (box["pos"] if short else 0)) @ W + b
        return t
    hooks = [(f"blocks.{l}.hook_resid_pre", lambda t, hook: box.update(x=t)), (f"blocks.{l}.attn.hook_{kind}", project)]
    return hooks + ([("hook_pos_embed", lambda t, hook: box.update(pos=t))] if short else [])


def _F(model, toks, x_ref, alpha, hooks, m=metric):
    """The metric with the stream entering block 0 at x_ref + alpha (x - x_ref) and ``hooks``."""
    line = ("blocks.0.hook_resid_pre", lambda t, hook: x_ref + alpha * (t - x_ref))
    with torch.no_grad():
        return float(m(model.run_with_hooks(toks, fwd_hooks=[line] + hooks)))


def _slope(model, toks, x_ref, alpha, make, m=metric):
    """w . g(alpha): d/d eps of the metric at alpha with ``make(eps)`` hooks, central differences."""
    return (_F(model, toks, x_ref, alpha, make(D), m) - _F(model, toks, x_ref, alpha, make(-D), m)) / (2 * D)


def _curvature(model, toks, x_ref, alpha, make, m=metric):
    """w . dg/d alpha: the mixed second derivative d^2 m / d alpha d eps, central differences."""
    return (_slope(model, toks, x_ref, alpha + D, make, m) - _slope(model, toks, x_ref, alpha - D, make, m)) / (2 * D)


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", True), pytest.param((None, "shortformer", False), marks=needs_tl3)]
EDGES = [("embed", "L1H0.q"), ("L0H1", "L2H1.k"), ("embed", "L0H0.v"), ("L1H1", "logits"), ("MLP0", "MLP2"), ("L0H0", "L2H0.v")]


# (grouped-query receivers are labelled per KV head: the QK fix's tests cover them)
@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params([v for v in ARCHITECTURES if v[3] != "gqa"])], ids=variant_id)
def test_hessian_term_is_the_derivative_of_the_gradient_along_the_line(variant):
    """corrected - first order = -(1/2) w_s . d g_r / d alpha at the run (alpha = 1): the mixed second
    derivative of the metric in the line's alpha and the edge's patch, by central differences; the
    first-order part is plain EAP. Heads at their z likewise."""
    model, toks, ref = _setup(variant)
    mlp_in = not model.cfg.attn_only
    model.cfg.use_hook_mlp_in = mlp_in
    try:
        fixed = ri.edge_attribution_patching(model, toks, metric, reference=ref, correction="hessian")
        plain = ri.edge_attribution_patching(model, toks, metric, reference=ref)
        x_ref = grab(model, ref, ["blocks.0.hook_resid_pre"])["blocks.0.hook_resid_pre"]
        assert (fixed.first_order - plain.effect).nan_to_num(0).abs().max() <= 1e-10
        for s, r in EDGES:
            if s.startswith("MLP") and not mlp_in:
                continue
            w = sender_write_change(model, toks, ref, s)
            want = -0.5 * _curvature(model, toks, x_ref, 1.0, lambda eps: _receiver_hooks(model, r, w, eps))
            got = fixed.edge(s, r) - plain.edge(s, r)
            assert got == pytest.approx(want, rel=2e-5, abs=1e-7), (s, r)
        node = ri.attribution_patching(model, toks, metric, reference=ref, correction="hessian")
        name = "blocks.1.attn.hook_z"
        d = grab(model, ref, [name])[name] - grab(model, toks, [name])[name]

        def nodes(eps):
            def add(t, hook):
                t = t.clone()
                t[:, :, 1] += eps * d[:, :, 1]
                return t
            return [(name, add)]
        want = -0.5 * _curvature(model, toks, x_ref, 1.0, nodes)
        assert float(node.effect[1, 1] - node.first_order[1, 1]) == pytest.approx(want, rel=2e-5, abs=1e-7)
    finally:
        model.cfg.use_hook_mlp_in = False


@pytest.mark.parametrize("rule", ["left", "right"])
def test_multi_step_and_gauss_rules_follow_their_definitions(rule):
    """m = 2 with the correction: sum over the points alpha_k of h w.g(alpha_k) -+ (h^2/2) w.g'(alpha_k)
    (h = 1/2; + for segments starting at alpha_k, the left rule); Gauss-Legendre with m = 2: the two
    points 1/2 -+ 1/(2 sqrt 3), weight 1/2 each."""
    model, toks, ref = _setup(("LN", "standard", False))
    x_ref = grab(model, ref, ["blocks.0.hook_resid_pre"])["blocks.0.hook_resid_pre"]
    s, r = "L0H1", "L2H0.q"
    w = sender_write_change(model, toks, ref, s)
    make = lambda eps: _receiver_hooks(model, r, w, eps)  # noqa: E731
    alphas = [0.0, 0.5] if rule == "left" else [0.5, 1.0]
    sign = 1 if rule == "left" else -1
    want = sum(0.5 * _slope(model, toks, x_ref, a, make) + sign * 0.125 * _curvature(model, toks, x_ref, a, make) for a in alphas)
    got = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=2, ig_rule=rule, correction="hessian")
    assert got.edge(s, r) == pytest.approx(want, rel=2e-5, abs=1e-7)
    gauss = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=2, ig_rule="gauss")
    nodes = [0.5 - 0.5 / 3**0.5, 0.5 + 0.5 / 3**0.5]
    assert gauss.edge(s, r) == pytest.approx(sum(0.5 * _slope(model, toks, x_ref, a, make) for a in nodes), abs=1e-6)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_gauss_points_are_legendre_nodes_and_weights(m):
    nodes, weights = gauss_points(m)
    x, w = np.polynomial.legendre.leggauss(m)
    assert np.allclose(nodes, (x + 1) / 2, atol=1e-13) and np.allclose(weights, w / 2, atol=1e-13)
    # exact for polynomials of degree 2m - 1 on [0, 1]
    assert sum(wi * xi ** (2 * m - 1) for xi, wi in zip(nodes, weights)) == pytest.approx(1 / (2 * m), abs=1e-13)


def _quadratic(seed):
    """One layer, two heads, no norm, one position (the pattern is 1: z = x W_V + b_V, linear in the
    input): the embedding lives on e0, e1, head 0 writes e2, e3 and head 1 e4, e5, logit 0 reads e2, e3
    and logit 1 reads e4, e5. The metric below is quadratic in the logits, and separable: quadratic in
    each patched activation, with no cross term between two of them."""
    model = make_variant(None, "standard", True, seed=seed, n_layers=1, n_heads=2, d_head=2, d_model=6)
    state = {k: torch.zeros_like(v) for k, v in _backend.portable_state(model).items()}
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    state["embed.W_E"][:, :2] = rnd(model.cfg.d_vocab, 2)
    for h, dims in ((0, slice(2, 4)), (1, slice(4, 6))):
        state["blocks.0.attn.W_Q"][h], state["blocks.0.attn.W_K"][h] = rnd(6, 2), rnd(6, 2)
        state["blocks.0.attn.W_V"][h, :2] = rnd(2, 2)
        state["blocks.0.attn.b_V"][h] = rnd(2)
        state["blocks.0.attn.W_O"][h, :, dims] = rnd(2, 2)
    state["unembed.W_U"][2:4, 0], state["unembed.W_U"][4:6, 1] = rnd(2), rnd(2)
    _backend.load_portable_state(model, state)
    return model


def quadratic_metric(logits):
    return (logits[:, 0, 0] ** 2 + 0.5 * logits[:, 0, 1] ** 2 + 0.3 * logits[:, 0, 0]).mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hessian_correction_is_exact_patching_where_the_metric_is_quadratic(seed):
    """On the construction above, every edge's corrected estimate is its exact path patch and every
    head's its exact z patch (to 1e-9), where the first-order estimate is off by the quadratic term."""
    model = _quadratic(seed)
    g = torch.Generator().manual_seed(seed + 7)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (5, 1), generator=g) for _ in range(2))
    fixed = ri.edge_attribution_patching(model, toks, quadratic_metric, reference=ref, correction="hessian")
    exact = ri.path_patching(model, toks, quadratic_metric, reference=ref)
    E = exact.layout.exists
    assert (fixed.effect - exact.effect)[E].abs().max() <= 1e-9
    assert (fixed.first_order - exact.effect)[E].abs().max() > 1e-2
    node = ri.attribution_patching(model, toks, quadratic_metric, reference=ref, correction="hessian")
    z = lambda t: grab(model, t, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"]  # noqa: E731
    zr = z(ref)
    with torch.no_grad():
        clean = float(quadratic_metric(model(toks)))
        for h in range(2):
            def patch(t, hook, h=h):
                t = t.clone()
                t[:, :, h] = zr[:, :, h]
                return t
            want = float(quadratic_metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_z", patch)]))) - clean
            assert float(node.effect[0, h]) == pytest.approx(want, abs=1e-9)
            assert abs(float(node.first_order[0, h]) - want) > 1e-3


def _fused(t, hook):
    """``hook_z`` plus 0 times PyTorch's fused scaled-dot-product attention of it: the values are the
    model's, and the backward pass runs the fused kernel's backward, which autograd cannot
    differentiate again (as a Hugging Face module's attention)."""
    x = t.transpose(1, 2)
    return t + 0.0 * torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True).transpose(1, 2)


def test_attention_that_cannot_be_differentiated_twice_is_refused(toy2_f64, small_batch):
    toks, ref = small_batch.tokens[:2], small_batch.tokens[2:4]
    m = lambda lg: lg[:, -1].log_softmax(-1)[:, 3].mean()  # noqa: E731
    fused = [("blocks.1.attn.hook_z", _fused)]
    with toy2_f64.hooks(fwd_hooks=fused), pytest.raises(ValueError, match="differentiated twice"):
        ri.edge_attribution_patching(toy2_f64, toks, m, reference=ref, correction="hessian")
    with toy2_f64.hooks(fwd_hooks=fused):
        ri.edge_attribution_patching(toy2_f64, toks, m, reference=ref)  # first order: fine


def test_bad_corrections_are_refused(toy2, small_batch):
    toks, ref = small_batch.tokens[:2], small_batch.tokens[2:4]
    m = lambda lg: lg[:, -1, 0].mean()  # noqa: E731
    with pytest.raises(ValueError, match="correction must be"):
        ri.edge_attribution_patching(toy2, toks, m, reference=ref, correction="newton")
    with pytest.raises(ValueError, match="give ig_steps"):
        ri.edge_attribution_patching(toy2, toks, m, reference=ref, ig_rule="gauss")
    with pytest.raises(ValueError, match="Gauss-Legendre"):
        ri.attribution_patching(toy2, toks, m, reference=ref, ig_rule="gauss", ig_steps=2, correction="hessian")
    with pytest.raises(ValueError, match="ig_rule must be"):
        ri.attribution_patching(toy2, toks, m, reference=ref, ig_rule="middle", ig_steps=2)
