"""Issue 52: post-norm blocks (a norm ``P`` on each sublayer's output before it enters the stream: Gemma-2,
Gemma-3, OLMo-2 on TransformerLens 4; ``use_normalization_before_and_after`` on 3.x's native models), each
definition against a brute force written here, in float64 (docs/project/tolerances.md, "Post-norm blocks"):

- frozen (DLA, second order, the certificate's ``heads``): a head writes ``P_lin(z_h W_O^h) = gain * c(z_h W_O^h) / s``,
  ``s`` the scale of the attention's whole output ``r`` on the run;
- linearised (edge attribution patching, EAP-IG, the QK fix): a change ``d_h`` of the head's output writes
  ``J_P(r) (d_h W_O^h)``, and a head's edges sum to its node attribution;
- patched (path patching, circuits): ``P(r + d_h W_O^h) - P(r)``, only that head's output moved.

The norms are written out here from the checkpoint (Gemma's gain ``1 + w``, OLMo-2's ``w``, the Hugging Face
module's epsilon) or the native config; the stream is read with plain hooks; derivatives by autograd.
"""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.exact.certificate import TOLERANCES
from tests.builders import make_variant
from tests.hf_families import metric, save_checkpoint, token_pair

#: TransformerLens 4: tiny perturbed checkpoints; 3.x: native models with a norm before and after each sublayer.
#: (3.9 builds only RMSNorm after the sublayers: its LayerNorm branch tests the kind's name "LayerNorm", never "LN".)
CASES = ["gemma3", "olmo2", "gemma2"] + ([] if _backend.TL_MAJOR >= 4 else ["native RMS"])


@pytest.fixture(scope="module", params=CASES)
def model(request, tmp_path_factory):
    if request.param.startswith("native"):
        norm = request.param.split()[1]
        return make_variant(norm, "rotary", False, use_normalization_before_and_after=True, d_vocab=300, n_ctx=16, n_heads=4)
    folder = tmp_path_factory.mktemp(request.param)
    save_checkpoint(request.param, folder)
    return ri.load_pretrained(folder, dtype=torch.float64)


@pytest.fixture(scope="module")
def tokens():
    return token_pair()


def _tol(model) -> float:
    return 10 * TOLERANCES[(model.cfg.dtype, _backend.model_source(model))]


def _close(got, want, model, what):
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    scale = max(1.0, float(want.abs().max()))
    assert float((got - want).abs().max()) <= _tol(model) * scale, f"{what}: {got} vs {want}"


def _parts(model, module):
    """``(gain, centres, bias, eps)`` of a norm written out: on a Hugging Face module RMSNorm with Gemma's gain
    ``1 + w`` (its stored offset) or OLMo-2's ``w`` and the module's epsilon; on a native one its class's kind,
    ``w`` (none for the Pre kinds, whose gain is folded into the next weights), ``b`` and the config's ``eps``."""
    hf = getattr(module, "original_component", None)
    if hf is not None:
        w = hf.weight.detach().to(torch.float64)
        return (1 + w if type(hf).__name__.startswith("Gemma") else w), False, None, float(
            getattr(hf, "eps", getattr(hf, "variance_epsilon", None)))
    kind = {"LayerNorm": "LN", "LayerNormPre": "LNPre", "RMSNorm": "RMS", "RMSNormPre": "RMSPre"}[type(module).__name__]
    w, b = getattr(module, "w", None), getattr(module, "b", None)
    gain = torch.ones(model.cfg.d_model, dtype=torch.float64) if w is None else w.detach()  # the Pre kinds: no gain
    return gain, kind.startswith("LN"), None if b is None else b.detach(), model.cfg.eps


def _centre(x, centres):
    return x - x.mean(-1, keepdim=True) if centres else x


def written_norm(model, module):
    """The norm ``gain * c(x) / sqrt(mean(c(x)^2) + eps) + bias`` (:func:`_parts`)."""
    gain, centres, bias, eps = _parts(model, module)

    def norm(x):
        c = _centre(x, centres)
        y = gain * c / (c.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        return y if bias is None else y + bias
    return norm


def _linear(model, module, x, v):
    """``v`` through the norm with its scale frozen at ``x``'s, its bias left out: ``gain * c(v) / s(x)``."""
    gain, centres, _, eps = _parts(model, module)
    s = (_centre(x, centres).pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return gain * _centre(v, centres) / s


def _bias(model, module):
    bias = _parts(model, module)[2]
    return 0.0 if bias is None else bias


def _record(model, toks, names):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[(n, lambda t, hook, n=n: box.__setitem__(n, t.detach().clone())) for n in names])
    return box


def _weights(model, l):
    attn = model.blocks[l].attn
    W_O = attn.W_O.detach().to(torch.float64)
    b_O = getattr(attn, "b_O", None)
    b_O = torch.zeros(W_O.shape[-1], dtype=torch.float64) if b_O is None else b_O.detach().to(torch.float64)
    return W_O, b_O


def _olmo2_on_3x(model):
    """3.9's OLMo-2 keeps its norms after the sublayers at ``ln1``/``ln2`` (its ``POST_NORM_ARCHITECTURES``), and has
    none before them."""
    return _backend.TL_MAJOR == 3 and getattr(model.cfg, "original_architecture", None) == "Olmo2ForCausalLM"


def _post(model, l, which="ln1"):
    """Layer ``l``'s norm after its attention (``"ln1"``) or MLP (``"ln2"``)."""
    return model.blocks[l]._modules[which if _olmo2_on_3x(model) else f"{which}_post"]


def _pre(model, l, which):
    """Layer ``l``'s norm before its attention (``"ln1"``) or MLP (``"ln2"``); None where there is none (OLMo-2)."""
    return None if _olmo2_on_3x(model) else model.blocks[l]._modules.get(which)


def _ln1(model, l):
    return _pre(model, l, "ln1")


def _run(model, toks):
    L = model.cfg.n_layers
    names = [f"blocks.{l}.attn.hook_z" for l in range(L)] + [f"blocks.{l}.attn.hook_pattern" for l in range(L)]
    names += [f"blocks.{l}.hook_resid_pre" for l in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    return _record(model, toks, names)


def test_the_heads_identity_holds_and_is_the_frozen_sum(model, tokens):
    """The certificate's ``heads`` holds on a post-norm model, and what it says is the model's: the heads' frozen
    writes (the norm written out here) plus the bias part are ``hook_attn_out``."""
    assert ri.certify(model).holds("heads", "stream", "z")
    toks = tokens[0]
    box = _record(model, toks, ["blocks.0.attn.hook_z", "blocks.0.hook_attn_out"])
    W_O, b_O = _weights(model, 0)
    z = box["blocks.0.attn.hook_z"].to(torch.float64)
    r = torch.einsum("bphd,hdm->bpm", z, W_O) + b_O
    post = _post(model, 0)
    parts = [_linear(model, post, r, z[:, :, h] @ W_O[h]) for h in range(z.shape[2])] + [_linear(model, post, r, b_O.expand_as(r)) + _bias(model, post)]
    _close(sum(parts), box["blocks.0.hook_attn_out"], model, "frozen heads + bias = attn_out")


def test_dla_of_each_head_is_its_frozen_write_read_out(model, tokens):
    """Each head's DLA is ``P_lin(z_h W_O^h)`` through the frozen final norm onto the target's centred logit."""
    if _backend.logit_softcap(model) is not None:
        with pytest.raises(ValueError, match="soft-cap"):
            ri.direct_logit_attribution(model, tokens[0], targets=ri.next_token_targets(tokens[0]))
        return
    toks = tokens[0]
    targets = ri.next_token_targets(toks)
    dla = ri.direct_logit_attribution(model, toks, targets=targets)
    box = _run(model, toks)
    L = model.cfg.n_layers
    final = box[f"blocks.{L - 1}.hook_resid_post"].to(torch.float64)
    W_U = model.W_U.detach().to(torch.float64)
    direction = (W_U.T[targets.clamp(min=0)] - W_U.mean(1))  # (batch, pos, d_model)
    for l, h in [(0, 1), (1, 2)]:
        W_O, b_O = _weights(model, l)
        z = box[f"blocks.{l}.attn.hook_z"].to(torch.float64)
        r = torch.einsum("bphd,hdm->bpm", z, W_O) + b_O
        write = _linear(model, _post(model, l), r, z[:, :, h] @ W_O[h])
        want = (_linear(model, model.ln_final, final, write) * direction).sum(-1)
        got = dla.contributions[dla.labels.index(f"L{l}H{h}")]
        _close(got[targets >= 0], want[targets >= 0], model, f"L{l}H{h}")


def test_second_order_of_one_path_is_the_frozen_chain(model, tokens):
    """Source L0H1 through head L1H0 at the last position: ``sum_k A[q, k] ln1_lin(write_s[k]) W_V W_O``, through
    layer 1's frozen post-norm and the frozen final norm, onto the target's centred logit."""
    if _backend.logit_softcap(model) is not None:
        return  # refused for the soft-cap (test above)
    toks = tokens[0]
    targets = torch.randint(0, 299, toks.shape, generator=torch.Generator().manual_seed(5))
    so = ri.second_order_attribution(model, toks, targets=targets, positions=[-1])
    box = _run(model, toks)
    W_O0, b_O0 = _weights(model, 0)
    z0 = box["blocks.0.attn.hook_z"].to(torch.float64)
    r0 = torch.einsum("bphd,hdm->bpm", z0, W_O0) + b_O0
    src = _linear(model, _post(model, 0), r0, z0[:, :, 1] @ W_O0[1])  # (batch, key, d_model)
    ln1 = _ln1(model, 1)
    x1 = box["blocks.1.hook_resid_pre"].to(torch.float64)
    read = src if ln1 is None else _linear(model, ln1, x1, src)
    W_V = model.blocks[1].attn.W_V.detach().to(torch.float64)
    W_V = W_V[0 // (model.cfg.n_heads // W_V.shape[0])]
    W_O1, b_O1 = _weights(model, 1)
    A = box["blocks.1.attn.hook_pattern"].to(torch.float64)[:, 0, -1]  # (batch, key)
    out = torch.einsum("bk,bkm->bm", A, read @ W_V) @ W_O1[0]  # (batch, d_model) at the last query
    z1 = box["blocks.1.attn.hook_z"].to(torch.float64)
    r1 = (torch.einsum("bphd,hdm->bpm", z1, W_O1) + b_O1)[:, -1]
    out = _linear(model, _post(model, 1), r1, out)
    L = model.cfg.n_layers
    final = box[f"blocks.{L - 1}.hook_resid_post"].to(torch.float64)[:, -1]
    W_U = model.W_U.detach().to(torch.float64)
    direction = W_U.T[targets[:, -1]] - W_U.mean(1)
    want = (_linear(model, model.ln_final, final, out) * direction).sum(-1)
    got = so.contributions[so.sources.index("L0H1"), so.destinations.index("L1H0"), :, 0]
    _close(got, want, model, "L0H1 -> L1H0")


def _module_patch(module, delta):
    return module.register_forward_pre_hook(lambda mod, args: (args[0] + delta.to(args[0].dtype), *args[1:]))


def _mlp_reader(model, l):
    """The module whose input is layer ``l``'s MLP's read of the stream: its norm, or the MLP itself (OLMo-2)."""
    block = model.blocks[l]
    return _pre(model, l, "ln2") or block.mlp


def _head_change(model, toks, ref, l, h):
    """(r, d W_O^h): layer ``l``'s raw attention output on ``toks`` and head ``h``'s change to the reference's."""
    zs = f"blocks.{l}.attn.hook_z"
    z, zr = _record(model, toks, [zs])[zs].to(torch.float64), _record(model, ref, [zs])[zs].to(torch.float64)
    W_O, b_O = _weights(model, l)
    return torch.einsum("bphd,hdm->bpm", z, W_O) + b_O, (zr - z)[:, :, h] @ W_O[h]


def test_an_edge_estimate_is_the_jacobian_write_against_the_receiver_gradient(model, tokens):
    """EAP(L0H1 -> r) = ``J_P(r0) (d W_O)`` (autograd through the norm written out) dotted with d metric / d input_r
    (autograd through a module hook on the receiver's input), for r the logits and MLP1."""
    toks, ref = tokens
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    r, dW = _head_change(model, toks, ref, 0, 1)
    _, w = torch.func.jvp(written_norm(model, _post(model, 0)), (r,), (dW,))
    for receiver, module in (("logits", model.ln_final), ("MLP1", _mlp_reader(model, 1))):
        e = torch.zeros((), dtype=torch.float64, requires_grad=True)
        handle = module.register_forward_pre_hook(lambda mod, args: (args[0] + e * w.to(args[0].dtype), *args[1:]))
        try:
            (grad,) = torch.autograd.grad(metric(model(toks)), e)
        finally:
            handle.remove()
        _close(eap.edge("L0H1", receiver), grad, model, f"L0H1 -> {receiver}")


@pytest.mark.parametrize("ig_steps", [None, 3])
def test_a_heads_edges_sum_to_its_node_attribution(model, tokens, ig_steps):
    """With and without integrated gradients (each pass's post-norm Jacobian), a head's outgoing edges sum to its
    node attribution, which differentiates through the real norm."""
    toks, ref = tokens
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=ig_steps)
    node = ri.attribution_patching(model, toks, metric, reference=ref, ig_steps=ig_steps)
    totals = dict(zip(eap.layout.senders, eap.sender_totals().tolist()))
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            _close(totals[f"L{l}H{h}"], float(node.effect[l, h]), model, f"L{l}H{h}")


def test_the_hessian_correction_on_post_norm_edges_is_refused_by_name(model, tokens):
    with pytest.raises(ValueError, match="post-norm"):
        ri.edge_attribution_patching(model, *tokens[:1], metric, reference=tokens[1], correction="hessian")


def test_path_patching_and_circuits_patch_each_head_through_the_real_norm(model, tokens):
    """Path patching L0H1 -> logits adds ``P(r + d W_O) - P(r)`` to the final norm's input; cutting the edges of
    L0H1 and L0H2 into the logits from a full circuit adds each head's own change (not the change of both at once)."""
    toks, ref = tokens
    post = written_norm(model, _post(model, 0))
    with torch.no_grad():
        clean = float(metric(model(toks)))
    changes = {}
    for h in (1, 2):
        r, dW = _head_change(model, toks, ref, 0, h)
        changes[h] = post(r + dW) - post(r)
    pp = ri.path_patching(model, toks, metric, reference=ref, edges=[("L0H1", "logits")])
    for patch, what in ((changes[1], "path patching"), (changes[1] + changes[2], "circuit")):
        handle = _module_patch(model.ln_final, patch)
        try:
            with torch.no_grad():
                want = float(metric(model(toks)))
        finally:
            handle.remove()
        if what == "path patching":
            _close(pp.edge("L0H1", "logits"), want - clean, model, what)
        else:
            layout = ri.edge_layout(model)
            keep = [e for e in layout.edges() if e not in (("L0H1", "logits"), ("L0H2", "logits"))]
            _close(ri.evaluate_circuit(model, toks, metric, keep, reference=ref), want, model, what)


def test_weight_based_scores_are_refused_on_post_norm_blocks(model):
    for fn in (lambda: ri.composition_scores(model, which="v"), lambda: ri.copying_scores(model)):
        with pytest.raises(ValueError, match="post-norm blocks"):
            fn()


class _Frozen:
    """The frozen replacement model by brute force (tests/features/test_graph.py's, the MLP's input written out here):
    every pattern and norm scale of the clean run put back (the post-norms' too), the MLP's input the norm before it
    written out with the clean scale (none on OLMo-2), every MLP output the clean one plus the skip's change plus
    the change made."""

    def __init__(self, model, tcs, tokens):
        from tests.features.test_graph import Frozen

        outer = self

        class Hand(Frozen):
            def mlp_in(self, l, resid):
                return outer.mlp_in(l, resid)

        self.model, self.cache_mid = model, _record(model, tokens[None], [f"blocks.{l}.hook_resid_mid" for l in range(model.cfg.n_layers)])
        self.hand = Hand(model, tcs, tokens)

    def mlp_in(self, l, resid):
        module = _pre(self.model, l, "ln2")
        if module is None:
            return resid
        return _linear(self.model, module, self.cache_mid[f"blocks.{l}.hook_resid_mid"], resid) + _bias(self.model, module)


def test_the_feature_graph_is_the_frozen_replacement(model):
    """Every row of the graph (features' pre-activations, logits) is the frozen replacement model's, and a node's
    column is the change its write makes there: the post-norms' scales frozen with the rest."""
    from rs_interp.features import attribution_graph, mlp_transcoders
    from tests.features.test_graph import _rows, node_write
    from tests.features.test_transcoders import random_transcoders

    if _backend.logit_softcap(model) is not None:
        with pytest.raises(ValueError, match="soft-capped logits"):
            attribution_graph(model, random_transcoders(model.cfg.n_layers, model.cfg.d_model, 8), torch.arange(5))
        return
    with pytest.raises(ValueError, match="post-norm blocks|not plain ReLU MLPs"):  # gated MLPs refused first
        mlp_transcoders(model)
    d, L, P = model.cfg.d_model, model.cfg.n_layers, 9
    tcs = random_transcoders(L, d, 24, seed=2)
    tokens = torch.randint(0, 299, (P,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tcs, tokens, targets=[0, 7, 21], position=-2)
    bf = _Frozen(model, tcs, tokens).hand
    base = bf.targets(g, *bf.run())
    rows = _rows(g)
    _close(g.values[rows], base, model, "rows")
    feats = [n for n in range(g.n_features)][:4]
    for n in feats + [g.error_node(1, 3), g.token_node(4)]:
        embed_delta, out_delta = node_write(bf, g, tcs, n)
        moved = bf.targets(g, *bf.run(embed_delta=embed_delta, out_delta=out_delta))
        _close(g.adjacency[rows, n], moved - base, model, f"node {g.labels()[n]}")


def test_the_qk_fix_moves_the_query_by_the_jacobian_write(model, tokens):
    """The QK-fixed edge L0H1 -> L1H0.q is ``dm/dz . (z' - z)`` for head L1H0, ``z'`` its output with its query read
    from ``x + J_P(r0) (d W_O)`` (the Jacobian write), that head's alone (the receiver's input, as edge attribution
    patching and path patching move it): the norm before the query written out and applied to the moved stream,
    head 0's slice of the query recomputed from it, the pattern recomputed by the model's own attention. Under
    OLMo-2's query norm, which spans the heads (issue 60), head 0's query is ``slice_0(q_norm((x + w) W_Q))``: the
    model's own norm of every head's projection of the moved input, put back at the norm's output (before issue 60
    the QK fix moved head 0's projection alone before the norm: 0.01509 against 0.01578 on the float64 checkpoint);
    elsewhere on 4.x q_proj's head-0 slice recomputed, on 3.x the write added to head 0's ``hook_q_input``."""
    toks, ref = tokens
    fixed = ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True)
    r, dW = _head_change(model, toks, ref, 0, 1)
    _, w = torch.func.jvp(written_norm(model, _post(model, 0)), (r,), (dW,))
    attn, d_head = model.blocks[1].attn, model.cfg.d_head
    x = _record(model, toks, ["blocks.1.hook_resid_pre"])["blocks.1.hook_resid_pre"].to(torch.float64)
    ln1 = _ln1(model, 1)
    moved = (x + w) if ln1 is None else written_norm(model, ln1)(x + w)
    q_norm = getattr(attn, "q_norm", None)
    gain = None if q_norm is None else q_norm.w if _backend.TL_MAJOR == 3 else q_norm.original_component.weight
    module = None
    if gain is not None and gain.shape[-1] > d_head:  # OLMo-2's: one norm over every head's query
        if _backend.TL_MAJOR >= 4:
            q_all = attn._modules["q"].original_component(moved)  # q_proj itself (an nn.Linear)
        else:
            q_all = (torch.einsum("bpm,hmd->bphd", moved, attn.W_Q.detach()) + attn.b_Q.detach()).flatten(-2)
        new = q_norm.forward(q_all)  # the model's own norm of every head's projection of the moved input
        module, head_0 = q_norm, lambda mod, args: new
    elif _backend.TL_MAJOR >= 4:
        module = attn.original_component.q_proj
        head_0 = lambda mod, args: torch.nn.functional.linear(moved.to(args[0].dtype), mod.weight, mod.bias)  # noqa: E731
    if module is not None:
        def head_0_moved(mod, args, out):
            out = out.clone()
            out[..., :d_head] = head_0(mod, args)[..., :d_head].to(out.dtype)
            return out
        handle = module.register_forward_hook(head_0_moved)
        try:
            z_moved = _record(model, toks, ["blocks.1.attn.hook_z"])["blocks.1.attn.hook_z"][:, :, 0].to(torch.float64)
        finally:
            handle.remove()
    else:
        def add(t, hook):
            t = t.clone()
            t[:, :, 0] = t[:, :, 0] + w.to(t.dtype)  # head 0's query input alone, as q_proj's head-0 slice on 4.x
            return t

        model.set_use_split_qkv_input(True)
        try:
            with torch.no_grad():
                box = {}
                model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_q_input", add),
                                                      ("blocks.1.attn.hook_z", lambda t, hook: box.__setitem__("z", t.clone()))])
            z_moved = box["z"][:, :, 0].to(torch.float64)
        finally:
            model.set_use_split_qkv_input(False)
    z = _record(model, toks, ["blocks.1.attn.hook_z"])["blocks.1.attn.hook_z"][:, :, 0].to(torch.float64)
    e = torch.zeros_like(z, requires_grad=True)

    def add(t, hook):
        t = t.clone()
        t[:, :, 0] = t[:, :, 0] + e.to(t.dtype)
        return t

    (dz,) = torch.autograd.grad(metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", add)])), e)
    _close(fixed.edge("L0H1", "L1H0.q"), float((dz * (z_moved - z)).sum()), model, "QK-fixed L0H1 -> L1H0.q")


@pytest.mark.skipif(_backend.TL_MAJOR >= 4, reason="4.3's post-norm families normalise or soft-cap their scores (qk_attributions "
                    "refuses them for 'scores'); 3.x's native post-norm model reads its scores from the weights")
def test_head_loadings_are_shares_of_the_frozen_post_norm_write():
    """A QK attribution's head loading of a node is ``P_lin(o_s) . P_lin(o) / |P_lin(o)|^2``: ``o_s`` the change of the
    edge's ``pattern v_k W_O`` when the node's write is taken out of the frozen replacement model (brute force:
    tests/features/test_qk.py's), ``P_lin`` the norm after the attention with its scale frozen (an RMSNorm: its gain,
    the scale cancels)."""
    from rs_interp.features import attribution_graph, qk_attributions
    from tests.features.test_qk import Sides
    from tests.features.test_transcoders import random_transcoders

    model = make_variant("RMS", "rotary", False, use_normalization_before_and_after=True, seed=1, n_layers=3)
    tcs = random_transcoders(3, 16, 24, seed=2)
    tokens = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tcs, tokens, targets=[0, 7])
    bf = Sides(model, tcs, tokens)
    (a,) = qk_attributions(model, tcs, g, [(2, 1, 8, 3)])
    gain = _post(model, 2).w.detach()
    W_O = model.blocks[2].attn.W_O[1].detach()
    clean = bf.qk(2)["v"][3, 1]
    w = gain * (a.pattern * clean @ W_O)
    order = a.loadings[: g.n_nodes - g.n_logits].abs().argsort(descending=True)[:4].tolist()
    for s in order:
        v_s = bf.qk(2, out_delta=bf.removed(g, s)[0], embed_delta=bf.removed(g, s)[1])["v"][3, 1]
        w_s = gain * (a.pattern * (clean - v_s) @ W_O)
        assert abs(float(w_s @ w / (w @ w)) - float(a.loadings[s])) < 1e-9, a.labels[s]
    assert abs(float(a.loadings.sum()) - 1.0) < 1e-9


@pytest.mark.parametrize("method", ["eap-ig", "exact"])
def test_the_circuit_command_runs_end_to_end_on_gemma2(tmp_path, method):
    """Issue 52: ``rs-interp circuit`` runs end to end on a Gemma-2-shaped random checkpoint (EAP-IG through each
    pass's post-norm Jacobian; exact path patching through the norm), every file written, a score per edge."""
    import argparse

    from safetensors.torch import load_file

    from rs_interp.ui.circuit_command import add_arguments, run_command

    save_checkpoint("gemma2", tmp_path / "ckpt")
    out = tmp_path / "out"
    argv = ["--model", str(tmp_path / "ckpt"), "--task", "induction", "--method", method, "--out", str(out), "--n", "6",
            "--size", "0.2", "--ig-steps", "3", "--quiet"]
    assert run_command(add_arguments(argparse.ArgumentParser(prog="rs-interp circuit")).parse_args(argv))
    assert {"scores.safetensors", "curve.json", "circuit.json", "report.html", "summary.json"} <= {p.name for p in out.iterdir()}
    layout = ri.edge_layout(ri.load_pretrained(tmp_path / "ckpt", dtype=torch.float32))
    got = load_file(str(out / "scores.safetensors"))["effect"]
    assert got.shape == (len(layout.senders), len(layout.receivers))
    assert bool((got.isfinite() == layout.exists).all())  # a score for every edge, NaN off the graph


@pytest.mark.parametrize("which", ["q", "k"])
def test_the_node_qk_fix_patches_each_heads_query_alone(model, tokens, which):
    """The node QK fix (``which="q"``/``"k"``, ``qk_fix=True``) of head (or KV head) ``h`` is ``sum (z' - z) . dm/dz``
    over the heads reading it, ``z'`` with that one ``hook_q``/``hook_k`` slot set to the reference's (brute force: one
    run per slot). Under OLMo-2's query and key norms, which span the heads and sit after ``hook_q``/``hook_k``,
    patching every slot at once moves each head's normalised query through the others' (layer 0, query head 2:
    -0.366 against -0.275 on the float64 checkpoint)."""
    toks, ref = tokens
    got = ri.attribution_patching(model, toks, metric, reference=ref, which=which, qk_fix=True)
    H = model.cfg.n_heads
    for l in range(model.cfg.n_layers):
        name, zname = f"blocks.{l}.attn.hook_{which}", f"blocks.{l}.attn.hook_z"
        patch_to = _record(model, ref, [name])[name]
        z = _record(model, toks, [zname])[zname].to(torch.float64)
        e = torch.zeros_like(z, requires_grad=True)
        (dz,) = torch.autograd.grad(metric(model.run_with_hooks(toks, fwd_hooks=[(zname, lambda t, hook: t + e.to(t.dtype))])), e)
        n = patch_to.shape[2]
        for s in range(n):
            def patch(t, hook, s=s):
                t = t.clone()
                t[:, :, s] = patch_to[:, :, s]
                return t
            z_moved = _record_with(model, toks, [(name, patch)], zname).to(torch.float64)
            heads = [h for h in range(H) if h // (H // n) == s]
            want = float(((z_moved - z)[:, :, heads] * dz[:, :, heads]).sum())
            _close(got.effect[l, s], want, model, f"layer {l} {which} slot {s}")


def _record_with(model, toks, hooks, name):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=hooks + [(name, lambda t, hook: box.__setitem__("x", t.detach().clone()))])
    return box["x"]
