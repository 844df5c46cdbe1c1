"""Issue 44, AtP*: the QK fix and GradDrop against brute forces written here (plain hooks, autograd,
finite differences), and the two identities: a saturated head's key patch, a node whose direct and
indirect effects cancel."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from tests.builders import (
    architecture_params,
    grab,
    make_variant,
    needs_tl3,
    patching_metric,
    random_pair,
    sender_write_change,
    tl3_only,
    variant_id,
)
from tests.builders import ln1_by_hand as _norm

EPS = 1e-4


metric = patching_metric


_setup = random_pair



def _grad_z(model, toks):
    """dm/dz of every layer at the clean run, by autograd (apart from the library)."""
    box = {}

    def keep(t, hook):
        t = t.clone()
        t.retain_grad()
        box[hook.name] = t
        return t
    with torch.enable_grad():
        value = metric(model.run_with_hooks(toks, fwd_hooks=[(lambda n: n.endswith("attn.hook_z"), keep)]))
        value.backward()
    return {int(k.split(".")[1]): v.grad.detach() for k, v in box.items()}




def _receiver(model, receiver):
    """(layer, kind, index along hook_kind's head axis, query heads it feeds, the query head whose W it uses)."""
    head, kind = receiver.split(".")
    H = model.cfg.n_heads
    if "KV" in head:
        l, g = (int(x) for x in head[1:].split("KV"))
        group = H // _backend.kv_groups(model.cfg)
        return l, kind, g, list(range(g * group, (g + 1) * group)), g * group
    l, h = (int(x) for x in head[1:].split("H"))
    return l, kind, h, [h], h


def _z_moved(model, toks, receiver, w):
    """Layer l's z with ``w`` added to one query or key input: its projection recomputed by hand at
    hook_q / hook_k (before rotary) from the layer's input plus ``w``."""
    l, kind, index, _, qh = _receiver(model, receiver)
    attn, box = model.blocks[l].attn, {}
    W = _backend.attn_weight(attn, f"W_{kind.upper()}", model.cfg.n_heads)[qh]
    b = _backend.attn_weight(attn, f"b_{kind.upper()}", model.cfg.n_heads)[qh]
    short = model.cfg.positional_embedding_type == "shortformer"

    def project(t, hook):
        t = t.clone()
        t[:, :, index] = _norm(model, l, box["x"] + w + (box["pos"] if short else 0)) @ W + b
        return t
    hooks = [(f"blocks.{l}.hook_resid_pre", lambda t, hook: box.update(x=t)), (f"blocks.{l}.attn.hook_{kind}", project),
             (f"blocks.{l}.attn.hook_z", lambda t, hook: box.update(z=t.clone()))]
    hooks += [("hook_pos_embed", lambda t, hook: box.update(pos=t))] if short else []
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=hooks)
    return box["z"]


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", False), ("LNPre", "rotary", True),
            pytest.param((None, "shortformer", True), marks=needs_tl3)]


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_qk_fixed_edges_are_the_patched_pattern_against_dm_dz(variant):
    """QK(s -> r) = sum over batch, positions and the heads r feeds of (z' - z) . dm/dz, z' the head's
    output with w_s added to its query or key input; every other edge keeps plain EAP's number."""
    model, toks, ref = _setup(variant)
    fixed = ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True, per_example=True)
    plain = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    gz = _grad_z(model, toks)
    z = grab(model, toks, [f"blocks.{l}.attn.hook_z" for l in range(3)])
    layout = fixed.layout
    qk = [r for r in layout.receivers if r.endswith((".q", ".k"))]
    checked = 0
    for receiver in qk:
        l, _, _, heads, _ = _receiver(model, receiver)
        for sender in layout.senders:
            if not layout.exists[layout.senders.index(sender), layout.receivers.index(receiver)] or (sender.startswith("L") and checked > 12):
                continue
            moved = _z_moved(model, toks, receiver, sender_write_change(model, toks, ref, sender)) - z[f"blocks.{l}.attn.hook_z"]
            want = float((moved[:, :, heads] * gz[l][:, :, heads]).sum())
            assert fixed.edge(sender, receiver) == pytest.approx(want, abs=1e-9), (sender, receiver)
            checked += 1
    others = [j for j, r in enumerate(layout.receivers) if r not in qk]
    assert (fixed.effect[:, others] - plain.effect[:, others]).nan_to_num(0).abs().max() <= 1e-12  # shares summed: rounding
    assert (fixed.per_example.sum(0) - fixed.effect).nan_to_num(0).abs().max() <= 1e-12
    assert checked >= 10


@pytest.mark.parametrize("which", ["q", "k"])
@pytest.mark.parametrize("variant", [("LN", "standard", False), ("RMS", "rotary", False, "gqa")], ids=variant_id)
def test_qk_fixed_nodes_are_the_patched_pattern_against_dm_dz(variant, which):
    """Node ``hook_{q,k}`` set to the reference's (a KV head moves every query head of its group):
    (z' - z) . dm/dz over those heads; plain AtP of the same node is its gradient against q_ref - q."""
    model, toks, ref = _setup(variant)
    fixed = ri.attribution_patching(model, toks, metric, reference=ref, which=which, qk_fix=True)
    plain = ri.attribution_patching(model, toks, metric, reference=ref, which=which)
    gz = _grad_z(model, toks)
    names = [f"blocks.{l}.attn.hook_{which}" for l in range(3)]
    refs, z = grab(model, ref, names), grab(model, toks, [f"blocks.{l}.attn.hook_z" for l in range(3)])
    n = fixed.effect.shape[1]
    group = model.cfg.n_heads // n
    for l in range(3):
        for g in range(n):
            def patch(t, hook, l=l, g=g):
                t = t.clone()
                t[:, :, g] = refs[names[l]][:, :, g]
                return t
            moved = _cache_with(model, toks, [(names[l], patch)], f"blocks.{l}.attn.hook_z") - z[f"blocks.{l}.attn.hook_z"]
            heads = list(range(g * group, (g + 1) * group))
            assert float(fixed.effect[l, g]) == pytest.approx(float((moved[:, :, heads] * gz[l][:, :, heads]).sum()), abs=1e-9)
            # plain: the derivative along the patch, by central differences
            d = refs[names[l]][:, :, g] - grab(model, toks, [names[l]])[names[l]][:, :, g]

            def at(eps, l=l, g=g, d=d):
                def add(t, hook):
                    t = t.clone()
                    t[:, :, g] += eps * d
                    return t
                with torch.no_grad():
                    return float(metric(model.run_with_hooks(toks, fwd_hooks=[(names[l], add)])))
            assert float(plain.effect[l, g]) == pytest.approx((at(EPS) - at(-EPS)) / (2 * EPS), abs=1e-6)
    assert fixed.labels[0] == ("L0KV0" if n != model.cfg.n_heads else "L0H0") and fixed.effect_per_position is None


def _cache_with(model, toks, hooks, name):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=hooks + [(name, lambda t, hook: box.update(x=t.clone()))])
    return box["x"]


def _one_head(seed, *, saturation):
    """A one-layer attention-only model with one head and no norm: logits are linear in z."""
    model = make_variant(None, "standard", True, seed=seed, n_layers=1, n_heads=1, d_head=8, d_model=16)
    state = _backend.portable_state(model)
    state["blocks.0.attn.W_Q"] = state["blocks.0.attn.W_Q"] * saturation
    state["blocks.0.attn.W_K"] = state["blocks.0.attn.W_K"] * saturation
    state["blocks.0.attn.W_V"] = state["blocks.0.attn.W_V"] * 10  # a patch that moves the logits by O(1)
    _backend.load_portable_state(model, state)
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_qk_fix_on_a_saturated_head_is_exact_where_plain_atp_sees_nothing(seed):
    """A single saturated head (scores scaled 1000x: each query puts ~all its weight on one key), the
    metric linear in the logits, the logits linear in z: patching the head's key from the reference
    moves the metric by the exact patch, which the QK fix gives to 1e-9 (node and edge) while plain
    attribution patching, a gradient through the saturated softmax, gives under 1e-3 of it."""
    model = _one_head(seed, saturation=1000.0)
    g = torch.Generator().manual_seed(seed)
    toks, ref = (torch.stack([torch.randperm(model.cfg.d_vocab, generator=g)[:10] for _ in range(4)]) for _ in range(2))
    lin = lambda logits: (logits[:, 1:, 1] - logits[:, 1:, 2]).sum(-1).mean()  # noqa: E731
    pattern = grab(model, toks, ["blocks.0.attn.hook_pattern"])["blocks.0.attn.hook_pattern"]
    assert float(pattern.max(-1).values[..., 1:].mean()) > 0.999  # saturated: ~all the weight on one key
    k_ref = grab(model, ref, ["blocks.0.attn.hook_k"])["blocks.0.attn.hook_k"]
    with torch.no_grad():
        clean = float(lin(model(toks)))
        exact = float(lin(model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_k", lambda t, hook: k_ref)]))) - clean
    node = ri.attribution_patching(model, toks, lin, reference=ref, which="k", qk_fix=True)
    plain = ri.attribution_patching(model, toks, lin, reference=ref, which="k")
    assert abs(exact) > 0.05
    assert float(node.effect[0, 0]) == pytest.approx(exact, abs=1e-9)
    assert abs(float(plain.effect[0, 0])) < 1e-3 * abs(exact)
    # the edge embed -> L0H0.k carries the same patch (no norm: the key of x_ref is k_ref)
    edge = ri.edge_attribution_patching(model, toks, lin, reference=ref, qk_fix=True)
    pp = ri.path_patching(model, toks, lin, reference=ref, edges=[("embed", "L0H0.k")])
    assert edge.edge("embed", "L0H0.k") == pytest.approx(pp.edge("embed", "L0H0.k"), abs=1e-9)
    assert pp.edge("embed", "L0H0.k") == pytest.approx(exact, abs=1e-9)
    assert abs(ri.edge_attribution_patching(model, toks, lin, reference=ref).edge("embed", "L0H0.k")) < 1e-3 * abs(exact)


def _cancelling(seed):
    """Two one-head layers, one position, no norm, everything linear: L0H0 writes v along e2; the
    logit of token 0 reads e2 (direct effect +c) and e3; L1H0 copies e2 into e3 negated (indirect -c)."""
    model = make_variant(None, "standard", True, seed=seed, n_layers=2, n_heads=1, d_head=4, d_model=8)
    state = {k: torch.zeros_like(v) for k, v in _backend.portable_state(model).items()}
    g = torch.Generator().manual_seed(seed)
    state["embed.W_E"][:, :2] = torch.randn(model.cfg.d_vocab, 2, generator=g, dtype=torch.float64)
    state["blocks.0.attn.W_V"][0, :2, 0] = torch.tensor([1.0, -0.5], dtype=torch.float64)
    state["blocks.0.attn.W_O"][0, 0, 2] = 1.0
    state["blocks.1.attn.W_V"][0, 2, 0] = 1.0
    state["blocks.1.attn.W_O"][0, 0, 3] = -1.0
    state["unembed.W_U"][2, 0] = state["unembed.W_U"][3, 0] = 1.0
    _backend.load_portable_state(model, state)
    return model


@pytest.mark.parametrize("seed", [0, 1])
def test_grad_drop_reports_a_node_whose_effects_cancel(seed):
    """L0H0's direct effect on the logit cancels its effect through L1H0 exactly: plain attribution
    patching (and the exact patch) give it 0; GradDrop's pass without layer 1's gradient gives its
    direct effect, written out here: |(z_ref - z) . W_O e2|."""
    model = _cancelling(seed)
    g = torch.Generator().manual_seed(seed + 10)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (6, 1), generator=g) for _ in range(2))
    m = lambda logits: logits[:, -1, 0].mean()  # noqa: E731
    plain = ri.attribution_patching(model, toks, m, reference=ref)
    drop = ri.attribution_patching(model, toks, m, reference=ref, grad_drop=True)
    z = lambda t: grab(model, t, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"]  # noqa: E731
    direct = float((z(ref) - z(toks))[:, 0, 0, 0].mean())  # W_O e2 = 1 on head dim 0, the logit reads e2 once
    assert abs(direct) > 0.05
    assert abs(float(plain.effect[0, 0])) < 1e-12
    assert float(drop.effect[0, 0]) == pytest.approx(abs(direct), abs=1e-12)
    # L1H0 is in the last layer: neither pass drops anything it reads, (|AtP| + |AtP|) / (L - 1) with L = 2
    assert float(drop.effect[1, 0]) == pytest.approx(2 * abs(float(plain.effect[1, 0])), abs=1e-12)


def _frozen_derivative(model, toks, patch_name, add, layer):
    """d metric / d eps with ``add(t, eps)`` at ``patch_name`` while layer ``layer``'s readers (its
    hook_q/k/v and MLP input) read the clean run's values: the derivative with the gradient through
    that layer dropped."""
    frozen = []
    if layer is not None:
        names = [f"blocks.{layer}.attn.hook_{x}" for x in "qkv"] + ([] if model.cfg.attn_only else [f"blocks.{layer}.hook_mlp_in"])
        clean = grab(model, toks, names)
        frozen = [(n, lambda t, hook, n=n: clean[n]) for n in names]

    def at(eps):
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=[(patch_name, lambda t, hook: add(t, eps))] + frozen)))
    return (at(EPS) - at(-EPS)) / (2 * EPS)


@pytest.mark.parametrize("variant", [("LN", "standard", False), ("RMSPre", "rotary", True)], ids=variant_id)
def test_grad_drop_follows_its_definition(variant):
    """GradDrop(n) = (1 / (L - 1)) sum over l of |AtP_{-l}(n)|, AtP_{-l} the derivative along the patch
    with layer l's readers frozen (l = 0: nothing to freeze): heads by their z, and edges into the
    logits and into an MLP (whose receivers keep their own gradient: only layers after them drop)."""
    model, toks, ref = _setup(variant)
    if not model.cfg.attn_only:
        model.cfg.use_hook_mlp_in = True
    try:
        drop = ri.attribution_patching(model, toks, metric, reference=ref, grad_drop=True)
        edges = ri.edge_attribution_patching(model, toks, metric, reference=ref, grad_drop=True)
        L = 3
        for l in range(L):
            name = f"blocks.{l}.attn.hook_z"
            d = grab(model, ref, [name])[name] - grab(model, toks, [name])[name]
            for h in range(2):
                def add(t, eps, h=h, d=d):
                    t = t.clone()
                    t[:, :, h] += eps * d[:, :, h]
                    return t
                want = sum(abs(_frozen_derivative(model, toks, name, add, k if k > 0 else None)) for k in range(L)) / (L - 1)
                assert float(drop.effect[l, h]) == pytest.approx(want, abs=1e-6), (l, h)
        checks = [("L0H1", "logits", f"blocks.{L - 1}.hook_resid_post", None)]
        if not model.cfg.attn_only:
            checks.append(("L0H0", "MLP1", "blocks.1.hook_mlp_in", 1))
        for sender, receiver, point, layer in checks:
            w = sender_write_change(model, toks, ref, sender)
            add = lambda t, eps, w=w: t + eps * w  # noqa: E731
            want = sum(abs(_frozen_derivative(model, toks, point, add, k if layer is not None and k > layer else None))
                       for k in range(L)) / (L - 1)
            assert edges.edge(sender, receiver) == pytest.approx(want, abs=1e-6), (sender, receiver)
    finally:
        model.cfg.use_hook_mlp_in = False


def test_options_that_do_not_combine_are_refused(toy2, small_batch):
    toks, ref = small_batch.tokens[:2], small_batch.tokens[2:4]
    m = lambda lg: lg[:, -1, 0].mean()  # noqa: E731
    with pytest.raises(ValueError, match="do not combine"):
        ri.edge_attribution_patching(toy2, toks, m, reference=ref, qk_fix=True, ig_steps=2)
    with pytest.raises(ValueError, match="per-pair shares"):
        ri.edge_attribution_patching(toy2, toks, m, reference=ref, grad_drop=True, per_example=True)
    with pytest.raises(ValueError, match="which='q' or 'k'"):
        ri.attribution_patching(toy2, toks, m, reference=ref, qk_fix=True)
    with pytest.raises(ValueError, match="which must be"):
        ri.attribution_patching(toy2, toks, m, reference=ref, which="x")
    with pytest.raises(ValueError, match="True or False"):
        ri.edge_attribution_patching(toy2, toks, m, reference=ref, qk_fix=1)


@pytest.mark.parametrize("variant", [("LN", "standard", False), ("RMSPre", "rotary", True), ("RMS", "rotary", False, "gqa")], ids=variant_id)
def test_patterns_by_hand_and_by_the_models_attention_agree(variant, monkeypatch):
    """Where a layer's projections and pattern are reproduced, the QK fix forms the patched patterns by
    hand, for many senders at once; else the model's own attention runs on stacked copies. Both
    give the same numbers (the brute force above checks whichever a model takes)."""
    from rs_interp.circuits import atp_star

    model, toks, ref = _setup(variant)
    taken = []
    by_hand = atp_star._by_hand
    monkeypatch.setattr(atp_star, "_by_hand", lambda *a: taken.append(by_hand(*a) is not None) or by_hand(*a))
    hand = ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True, per_example=True)
    assert taken == [True] * 3  # every layer by hand
    monkeypatch.setattr(atp_star._backend, "projection_layers", lambda model: set())
    own = ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True, per_example=True)
    assert taken == [True] * 3  # not asked again
    assert (hand.per_example - own.per_example).nan_to_num(0).abs().max() <= 1e-10


@tl3_only("its qk-norm models")
def test_a_query_norm_is_not_reproduced_by_hand(monkeypatch):
    """A query/key norm makes the score other than the bilinear form of the projections: the certificate's
    `scores` fails, naming it, and the QK fix runs the model's own attention on every layer."""
    from rs_interp.circuits import atp_star

    model, toks, ref = _setup(("RMS", "rotary", False, "qk_norm"))
    assert "use_qk_norm" in ri.certify(model)["scores"].why
    taken = []
    monkeypatch.setattr(atp_star, "_by_hand", lambda *a: taken.append(1))
    ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True, per_example=True)
    assert taken == []
