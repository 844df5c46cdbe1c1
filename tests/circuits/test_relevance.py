"""Issue 66, relevance patching (rs_interp.circuits.relevance) against a brute force written here: the model's own
forward with LRP's rules put in by plain hooks (every norm's ``hook_scale`` and every ``hook_pattern`` detached,
the MLP's ``hook_post`` passing ``act(h) / h``, a gated product half its gradient), its plain autograd
gradient along each edge's write; the conservation identity on bias-free models; and its equality with
edge attribution patching where every rule is the gradient."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.circuits.graph import depth
from tests.builders import architecture_params, make_variant, patching_metric, random_pair, variant_id
from tests.finite_differences import write

metric = patching_metric

#: Every norm and both positional schemes with MLPs, two attention-only, and the architectures (gated, GQA, parallel ...);
#: the default suite runs three of the plain ones and the architectures, the others are marked slow.
FAST = [("LN", "standard", False), ("RMSPre", "rotary", True), (None, "standard", False)]
SLOW = [("LNPre", "standard", False), ("RMS", "standard", False), ("RMSPre", "standard", False), ("LN", "rotary", False),
        (None, "standard", True)]
VARIANTS = FAST + [pytest.param(v, marks=pytest.mark.slow, id=variant_id(v)) for v in SLOW]

EDGES = [("embed", "L0H1.v"), ("embed", "L2H0.q"), ("L0H1", "L2H0.k"), ("L0H0", "L1H1.v"), ("embed", "logits"),
         ("L2H1", "logits"), ("L1H0", "L2H1.v")]
MLP_EDGES = [("MLP0", "L1H0.v"), ("MLP1", "logits"), ("L1H0", "MLP1"), ("MLP0", "MLP2"), ("embed", "MLP0"), ("MLP1", "L2H1.v")]


def _rules(model, keep: dict) -> list:
    """LRP's rules as hooks on the raw forward (written apart from the library): the hooked values are unchanged,
    only their gradients are the rules'. ``keep`` receives each MLP's pre-activations."""
    gated = bool(getattr(model.cfg, "gated_mlp", False))

    def detach(t, hook):
        return t.detach()

    def pre(t, hook):
        keep[hook.name] = t

    def post(t, hook):
        l = hook.name.split(".")[1]
        h = keep[f"blocks.{l}.mlp.hook_pre"]
        act = (lambda x: torch.nn.functional.silu(x)) if model.cfg.act_fn == "silu" else None
        if gated:  # act(h) * lin (+ b_in); the half rule on the product, the identity rule on act(h)
            lin = keep[f"blocks.{l}.mlp.hook_pre_linear"]
            a = act(h)
            ratio = torch.where(h == 0, 0.0, a / torch.where(h == 0, 1.0, h)).detach()
            s = 0.5 * (h * ratio * lin.detach() + a.detach() * lin)
        else:
            ratio = torch.where(h == 0, 0.0, t / torch.where(h == 0, 1.0, h)).detach()
            s = h * ratio
        return t.detach() + s - s.detach()

    hooks = [(lambda n: n.endswith("hook_scale"), detach), (lambda n: n.endswith("attn.hook_pattern"), detach)]
    if not model.cfg.attn_only:
        hooks += [(lambda n: n.endswith("mlp.hook_pre") or n.endswith("mlp.hook_pre_linear"), pre),
                  (lambda n: n.endswith("mlp.hook_post"), post)]
    return hooks


def _frozen_ln1(model, layer, x, scale_of):
    """Layer ``layer``'s first norm of ``x`` with its scale that of ``scale_of`` held (the LN-rule), written out."""
    kind, ln = model.cfg.normalization_type, model.blocks[layer].ln1
    centre = (lambda v: v - v.mean(-1, keepdim=True)) if kind in ("LN", "LNPre") else (lambda v: v)
    if kind is None:
        return x
    s = (centre(scale_of).pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt().detach()
    out = centre(x) / s
    out = out * ln.w if kind in ("LN", "RMS") else out
    return out + ln.b if kind == "LN" else out


def brute_edges(model, toks, ref, edges):
    """Each edge's RelP by the brute force: d metric / d eps_e, ``eps_e`` times the sender's write change
    added to the receiver's input alone, through the rules' forward (one backward for all the edges)."""
    _, clean = model.run_with_cache(toks)
    _, refc = model.run_with_cache(ref)
    eps = torch.zeros(len(edges), dtype=model.cfg.dtype, requires_grad=True)
    ws = [write(model, clean, refc, s, toks, ref) for s, _ in edges]
    keep: dict = {}

    def add_to(point):
        def fn(t, hook):
            for i, (s, r) in enumerate(edges):
                if r == point:
                    t = t + eps[i] * ws[i]
            return t
        return fn

    def head_input(layer, kind):
        def stash(t, hook):
            keep[f"x{layer}"] = t

        def fn(t, hook):
            t = t.clone()
            attn = model.blocks[layer].attn
            for i, (s, r) in enumerate(edges):
                head, x = r.split(".") if "." in r else (r, None)
                if x != kind or not head.startswith(f"L{layer}H"):
                    continue
                h = int(head.split("H")[1])
                W, b = getattr(attn, f"W_{kind.upper()}")[h], getattr(attn, f"b_{kind.upper()}")[h]
                x = keep[f"x{layer}"].detach()  # the edge's own path only: the stream's is the model's own input
                moved = _frozen_ln1(model, layer, x + eps[i] * ws[i], x)
                t[:, :, h] = t[:, :, h] - t[:, :, h].detach() + (moved @ W + b) - (moved @ W + b).detach() + t[:, :, h].detach()
            return t
        return stash, fn

    L = model.cfg.n_layers
    hooks = _rules(model, keep)
    hooks.append((f"blocks.{L - 1}.hook_resid_post", add_to("logits")))
    for l in range(L):
        stash, _ = head_input(l, "v")
        hooks.append((f"blocks.{l}.hook_resid_pre", stash))
        hooks += [(f"blocks.{l}.attn.hook_{x}", head_input(l, x)[1]) for x in "qkv"]
        if not model.cfg.attn_only:
            hooks.append((f"blocks.{l}.hook_mlp_in", add_to(f"MLP{l}")))
    model.cfg.use_hook_mlp_in = True
    try:
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(metric(model.run_with_hooks(toks, fwd_hooks=hooks)), eps)
    finally:
        model.cfg.use_hook_mlp_in = False
    return dict(zip(edges, grad.tolist()))


@pytest.mark.parametrize("variant", VARIANTS + architecture_params(), ids=variant_id)
def test_relevance_patching_is_the_rules_autograd_gradient(variant):
    """Every edge (queries and keys exactly 0: the AH-rule) equals the brute force's, on every norm, positions,
    MLPs or not, gated (the half rule), grouped-query attention, parallel blocks and qk-norm."""
    model, toks, ref = random_pair(variant)
    grouped = len(variant) == 4 and variant[3] == "gqa"
    got = ri.edge_relevance_patching(model, toks, metric, reference=ref)
    edges = [e for e in EDGES + ([] if model.cfg.attn_only else MLP_EDGES)
             if not (grouped and e[1][-2:] in (".k", ".v")) and e in got.layout.edges()]
    want = brute_edges(model, toks, ref, edges)
    for e in edges:
        assert got.edge(*e) == pytest.approx(want[e], abs=1e-9, rel=1e-9), e
    qk = [j for j, r in enumerate(got.layout.receivers) if r.endswith((".q", ".k"))]
    assert float(got.effect[:, qk].nan_to_num(0).abs().max()) == 0.0


def _bias_free(model):
    state = _backend.portable_state(model)
    for name in state:
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "b" or leaf.startswith("b_"):
            state[name] = torch.zeros_like(state[name])
    _backend.load_portable_state(model, state)
    return model


def conservation_gaps(model, toks):
    """Per layer boundary, the RelP edges (zero ablation) crossing it minus ``-g . logits``, relative."""
    with torch.enable_grad():
        logits = model(toks).detach().requires_grad_(True)
        (g,) = torch.autograd.grad(metric(logits), logits)
    total = -float((g * logits.detach()).sum())
    relp = ri.edge_relevance_patching(model, toks, metric, ablation="zero")
    parallel = bool(getattr(model.cfg, "parallel_attn_mlp", False))
    ds = torch.tensor([depth(s, parallel=parallel) for s in relp.layout.senders])
    dr = torch.tensor([depth(r, parallel=parallel) for r in relp.layout.receivers])
    gaps = []
    for l in range(model.cfg.n_layers + 1):
        cut = 2 * l + 1  # layer l's heads' depth: senders before it, receivers at it or after (the logits: infinite)
        crossing = (ds[:, None] < cut) & (dr[None, :] >= cut)
        gaps.append(abs(float(relp.effect[crossing].sum()) - total) / abs(total))
    return gaps


@pytest.mark.parametrize("variant", VARIANTS + architecture_params(), ids=variant_id)
def test_relevance_is_conserved_on_bias_free_models(variant):
    """The conservation identity (module docstring): with every bias zero the edges crossing any layer boundary sum
    to -g . logits; with the biases back they do not (the biases' share)."""
    model, toks, _ = random_pair(variant)
    with_biases = max(conservation_gaps(model, toks))
    assert max(conservation_gaps(_bias_free(model), toks)) <= 1e-10
    assert with_biases > 1e-4


@pytest.mark.parametrize("variant", [(None, "standard", True), (None, "rotary", False), (None, "standard", False)], ids=variant_id)
def test_relevance_patching_is_attribution_patching_where_the_rules_are_the_gradient(variant):
    """No norm, ReLU MLPs and patterns independent of the input (W_Q = W_K = 0): RelP = EAP, edges and nodes."""
    model = make_variant(*variant, seed=1, n_layers=3, act_fn="relu")
    state = _backend.portable_state(model)
    for name in state:
        if name.endswith(("W_Q", "W_K")):
            state[name] = torch.zeros_like(state[name])
    _backend.load_portable_state(model, state)
    g = torch.Generator().manual_seed(2)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (2, 8), generator=g) for _ in range(2))
    relp = ri.edge_relevance_patching(model, toks, metric, reference=ref)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    scale = float(eap.effect.nan_to_num(0).abs().max())
    assert float((relp.effect - eap.effect).nan_to_num(0).abs().max()) <= 1e-12 * scale
    for which in ("z", "v"):
        a = ri.relevance_patching(model, toks, metric, reference=ref, which=which)
        b = ri.attribution_patching(model, toks, metric, reference=ref, which=which)
        assert float((a.effect - b.effect).abs().max()) <= 1e-12 * scale


@pytest.mark.parametrize("variant", [("LN", "standard", False), ("RMS", "rotary", False, "gqa")], ids=variant_id)
def test_a_heads_node_is_the_sum_of_its_edges_and_values_read_their_own(variant):
    model, toks, ref = random_pair(variant)
    edges = ri.edge_relevance_patching(model, toks, metric, reference=ref)
    node = ri.relevance_patching(model, toks, metric, reference=ref)
    totals = dict(zip(edges.layout.senders, edges.sender_totals().tolist()))
    want = torch.tensor([[totals[f"L{l}H{h}"] for h in range(2)] for l in range(3)], dtype=torch.float64)
    assert float((node.effect - want).abs().max()) <= 1e-10
    assert float(ri.relevance_patching(model, toks, metric, reference=ref, which="q").effect.abs().max()) == 0.0
    assert float((node.effect_per_position.sum(-1) - node.effect).abs().max()) <= 1e-12


def test_the_qk_fix_is_the_patched_pattern_against_the_rules_gradient_at_z():
    """``qk_fix=True``: an edge into a query or key = (z' - z) . R(z), z' the head's output with the receiver's
    input moved for real (a hooked run), R(z) the rules' gradient at z (the brute force's forward)."""
    model, toks, ref = random_pair(("LN", "standard", False))
    got = ri.edge_relevance_patching(model, toks, metric, reference=ref, qk_fix=True)
    _, clean = model.run_with_cache(toks)
    _, refc = model.run_with_cache(ref)
    keep: dict = {}
    box = {}

    def grab(t, hook):
        t = t.clone()
        t.retain_grad()
        box["z"] = t
        return t

    with torch.enable_grad():
        metric(model.run_with_hooks(toks, fwd_hooks=_rules(model, keep) + [("blocks.2.attn.hook_z", grab)])).backward()
    R = box["z"].grad.detach()
    for sender, kind in (("L0H1", "q"), ("embed", "k"), ("MLP1", "k")):
        w = write(model, clean, refc, sender, toks, ref)
        x = clean["blocks.2.hook_resid_pre"] + w
        from tests.builders import ln1_by_hand

        def moved(t, hook):
            t = t.clone()
            attn = model.blocks[2].attn
            t[:, :, 0] = ln1_by_hand(model, 2, x) @ getattr(attn, f"W_{kind.upper()}")[0] + getattr(attn, f"b_{kind.upper()}")[0]
            return t

        zbox = {}
        with torch.no_grad():
                model.run_with_hooks(toks, fwd_hooks=[(f"blocks.2.attn.hook_{kind}", moved),
                                                  ("blocks.2.attn.hook_z", lambda t, hook: zbox.__setitem__("z", t.clone()))])
        want = float(((zbox["z"] - clean["blocks.2.attn.hook_z"])[:, :, 0] * R[:, :, 0]).sum().detach())
        assert got.edge(sender, f"L2H0.{kind}") == pytest.approx(want, abs=1e-9, rel=1e-9), (sender, kind)


def test_positions_split_the_estimate_and_options_are_checked():
    """Per span the estimate sums to the position-free one (a separate call, 1e-12), for RelP, EAP and EAP-IG;
    bad options are refused by name."""
    model, toks, ref = random_pair(("LN", "standard", False))
    schema = ri.circuits.PositionSchema(("start", "middle", "end"), torch.tensor([[0, 0, 1, 1, 1, 1, 2, 2], [0, 1, 1, 1, 2, 2, 2, 2]]))
    for fn, kw in ((ri.edge_relevance_patching, {}), (ri.edge_attribution_patching, {}), (ri.edge_attribution_patching, {"ig_steps": 3})):
        whole = fn(model, toks, metric, reference=ref, **kw)
        for positions in (schema, "each"):
            split = fn(model, toks, metric, reference=ref, spans=positions, **kw)
            assert float((split.per_span.nansum(-1) - whole.effect.nan_to_num(0)).abs().max()) <= 1e-12
            assert split.positional().total().effect.isnan().equal(whole.effect.isnan())
    with pytest.raises(ValueError, match="per span it is not built"):
        ri.edge_relevance_patching(model, toks, metric, reference=ref, qk_fix=True, spans="each")
    with pytest.raises(ValueError, match="spans must be"):
        ri.edge_relevance_patching(model, toks, metric, reference=ref, spans="spans")
    with pytest.raises(ValueError, match="needs reference"):
        ri.edge_relevance_patching(model, toks, metric)
    with pytest.raises(ValueError, match="which='q' or 'k'"):
        ri.relevance_patching(model, toks, metric, reference=ref, qk_fix=True)
