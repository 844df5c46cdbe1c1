"""QK attributions (issue 54 item 1): every entry of the table is the score's change when its pair of
contributions is removed under the graph's freezes, by brute force written apart from rs_interp.features.

The brute force: ``Frozen`` of tests/features/test_graph.py (plain hooks putting back every clean pattern, norm scale
and MLP output) with one node's write taken out, reading the layer's ``hook_q`` (for the query side) or
``hook_k`` (for the key side); the score of a query from one run and a key from another is
``rot(q) . rot(k) / scale`` with the model's own rotary (the certificate's ``scores`` identity checks it
against the pattern). An entry is the mixed difference ``S(q, k) - S(q_-s, k) - S(q, k_-t) + S(q_-s, k_-t)``.
Float64 throughout, to 1e-9.
"""

from __future__ import annotations

import json

import pytest
import torch

from rs_interp import _backend
from rs_interp.features import (
    CrossLayerTranscoder,
    attribution_graph,
    qk_attributions,
    shipped_transcoders,
    top_attention,
)
from rs_interp.features.export import graph_json
from rs_interp.features.figures import graph_figure
from tests.builders import TL4, make_variant
from tests.features.test_graph import Frozen
from tests.features.test_transcoders import random_transcoders

TOL = 1e-9
CASES = [("LN", "standard", None, None), ("RMS", "rotary", None, 12), ("RMS", "rotary", "gqa", None), ("LNPre", "standard", "gqa", 10),
         ("LN", "rotary", "clt", None)]


class Sides(Frozen):
    """The frozen run with writes taken out, read at one layer's queries and keys."""

    def qk(self, layer, *, embed_delta=None, out_delta=None, no_positions=False):
        box = {}
        hooks = [(f"blocks.{layer}.attn.hook_{w}", lambda t, hook, w=w: box.__setitem__(w, t[0].detach().clone())) for w in "qkv"]
        if no_positions and "hook_pos_embed" in self.model.hook_dict:
            hooks.append(("hook_pos_embed", lambda t, hook: torch.zeros_like(t)))
        with self.model.hooks(fwd_hooks=hooks):
            self.run(embed_delta=embed_delta, out_delta=out_delta)
        return box

    def removed(self, g, n):
        """The query/key/value reads of the run without node ``n``'s write (``"position"``: without the positional embeddings)."""
        L, P, d = self.model.cfg.n_layers, g.n_pos, self.model.cfg.d_model
        out_delta, embed_delta = torch.zeros(L, P, d, dtype=torch.float64), torch.zeros(P, d, dtype=torch.float64)
        kind = g.kinds()[n] if isinstance(n, int) else n
        if kind == "feature":
            l, p, f = g.features[n].tolist()
            for m, W in self.tcs.writes_from(l):  # its own MLP output (a cross-layer transcoder: every later one too)
                out_delta[m, p] = -g.activations[n] * W[f]
        elif kind == "error":
            l, p = divmod(n - g.n_features, P)
            out_delta[l, p] = -g.errors[l, p]
        elif kind == "token":
            embed_delta[n - g.token_node(0)] = -self.embed[n - g.token_node(0)]
        return out_delta, embed_delta

    def score(self, layer, qv, kv):
        m = self.model
        rot = (lambda x, p: _backend.apply_rotary(m, layer, x)[0, p, 0]) if m.cfg.positional_embedding_type == "rotary" else None

        def at(x, p):
            if rot is None:
                return x
            full = torch.zeros(1, p + 1, 1, x.shape[-1], dtype=x.dtype)
            full[0, p, 0] = x
            return rot(full, p)
        return lambda q, k, qp, kp: float(at(qv(q), qp) @ at(kv(k), kp)) / _backend.attn_scale(m, layer)


@pytest.mark.parametrize("norm, pos, feature, max_nodes", CASES, ids=[f"{n}-{p}-{f or 'mha'}-{m or 'all'}" for n, p, f, m in CASES])
def test_entries_are_the_score_change_of_their_pair(norm, pos, feature, max_nodes):
    model = make_variant(norm, pos, False, None if feature == "clt" else feature, seed=1, n_layers=3)
    tcs = random_transcoders(3, 16, 24, activation="jumprelu" if max_nodes else "relu", skip=bool(max_nodes), seed=2)
    if feature == "clt":  # a cross-layer transcoder: each feature also writes to every later MLP output
        tcs = CrossLayerTranscoder.random(3, 16, 20, seed=2, dtype=torch.float64)
    tokens = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tcs, tokens, targets=[0, 7], max_feature_nodes=max_nodes)
    edges = [(2, 1, 8, 3), (1, 0, 6, 6), (2, 0, 7, 0)]
    bf = Sides(model, tcs, tokens)
    kvh = lambda h: h // (model.cfg.n_heads // (getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads))  # noqa: E731
    gen = torch.Generator().manual_seed(5)
    n_src = g.n_nodes - g.n_logits
    for a in qk_attributions(model, tcs, g, edges):
        l, h, q, k = a.layer, a.head, a.query, a.key
        S = bf.score(l, lambda r: r["q"][q, h], lambda r: r["k"][k, kvh(h)])
        clean = bf.qk(l)
        assert abs(S(clean, clean, q, k) - a.score) < TOL
        assert abs(float(a.table.sum()) - a.score) < TOL
        # nodes able to reach layer l at the query and key: features and errors of earlier layers, tokens
        pool = [n for n in range(n_src) if g.kinds()[n] == "token" or
                (g.kinds()[n] == "feature" and int(g.features[n, 0]) < l) or
                (g.kinds()[n] == "error" and (n - g.n_features) // g.n_pos < l)]
        def strongest(parts, n=3):  # the sources that write most, and two at random
            order = parts[pool].norm(dim=1).argsort(descending=True)
            rand = torch.randperm(len(pool), generator=gen)[:2]
            return list(dict.fromkeys([pool[int(i)] for i in order[:n]] + [pool[int(i)] for i in rand]))
        q_picks, k_picks = strongest(a.query_parts), strongest(a.key_parts)
        assert float(a.table[q_picks][:, k_picks].abs().max()) > 1e-2  # the brute force compares real entries
        for s in q_picks:
            qs = bf.qk(l, out_delta=bf.removed(g, s)[0], embed_delta=bf.removed(g, s)[1])
            for t in k_picks:
                ks = bf.qk(l, out_delta=bf.removed(g, t)[0], embed_delta=bf.removed(g, t)[1])
                pair = S(clean, clean, q, k) - S(qs, clean, q, k) - S(clean, ks, q, k) + S(qs, ks, q, k)
                assert abs(pair - float(a.table[s, t])) < TOL, (a.labels[s], a.labels[t])
        picks = k_picks
        # the positions' and the bias's rows: the query with every node off (and without positions)
        L, P, d = 3, g.n_pos, 16
        off = [-(bf.out[j] - tcs[j].b_dec - tcs[j].skip(bf.x[j])) for j in range(L)]
        all_off = bf.qk(l, out_delta=torch.stack(off), embed_delta=-bf.embed)
        bias_only = bf.qk(l, out_delta=torch.stack(off), embed_delta=-bf.embed, no_positions=True)
        t = picks[0]
        kt = bf.qk(l, out_delta=bf.removed(g, t)[0], embed_delta=bf.removed(g, t)[1])
        bias_row = S(bias_only, clean, q, k) - S(bias_only, kt, q, k)
        assert abs(bias_row - float(a.table[n_src + 2, t])) < TOL
        pos_row = (S(all_off, clean, q, k) - S(all_off, kt, q, k)) - bias_row
        assert abs(pos_row - float(a.table[n_src + 1, t])) < TOL
        assert abs(S(all_off, all_off, q, k) - float(a.table[n_src + 1:, n_src + 1:].sum())) < TOL
        if pos == "rotary":
            assert float(a.query_parts[n_src + 1].abs().max()) == 0.0
        if max_nodes is None:
            assert float(a.query_parts[n_src].abs().max()) == 0.0  # no unselected features
        else:  # the unselected features' row: all of them taken out at once
            sel = {tuple(f) for f in g.features.tolist()}
            delta = torch.zeros(L, P, d, dtype=torch.float64)
            for j in range(L):
                acts = tcs[j].encode(bf.x[j])
                for p, f in acts.nonzero().tolist():
                    if (j, p, f) not in sel:
                        delta[j, p] -= acts[p, f] * tcs[j].W_dec[f]
            qu = bf.qk(l, out_delta=delta)
            assert abs((S(clean, clean, q, k) - S(qu, clean, q, k)) - float(a.table[n_src].sum())) < TOL
        # the head loadings: each node's part of the edge's write along it
        W_O = _backend.attn_weight(model.blocks[l].attn, "W_O", model.cfg.n_heads)[h].detach()
        pattern = bf.cache[f"blocks.{l}.attn.hook_pattern"][0, h, q, k]
        assert abs(a.pattern - float(pattern)) < TOL
        o = pattern * clean["v"][k, kvh(h)] @ W_O
        for s in q_picks + k_picks:
            vs = bf.qk(l, out_delta=bf.removed(g, s)[0], embed_delta=bf.removed(g, s)[1])["v"][k, kvh(h)]
            o_s = pattern * (clean["v"][k, kvh(h)] - vs) @ W_O
            assert abs(float(o_s @ o / (o @ o)) - float(a.loadings[s])) < TOL
        assert abs(float(a.loadings.sum()) - 1.0) < TOL


@pytest.mark.parametrize("feature", [None, "gqa"])
def test_top_attention_is_the_change_when_the_write_is_removed(feature):
    model = make_variant("RMS", "rotary", False, feature, seed=1, n_layers=3)
    tcs = random_transcoders(3, 16, 24, seed=2)
    tokens = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tcs, tokens, targets=[0, 7])
    bf = Frozen(model, tcs, tokens)

    def target(logits):
        last = logits[g.position]
        return float((last - last.mean())[g.logit_tokens] @ g.logit_probabilities)

    base = target(bf.run()[1])
    top = top_attention(model, tcs, g, 6)
    assert len(top) == 6 and abs(top[0][1]) >= abs(top[-1][1])
    group = model.cfg.n_heads // (getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads)
    for (l, h, q, k), effect in top:
        pattern = bf.cache[f"blocks.{l}.attn.hook_pattern"][0, h, q, k]
        v = bf.cache[f"blocks.{l}.attn.hook_v"][0, k, h // group]

        def cut(t, hook, h=h, q=q, write=pattern * v):
            t = t.clone()
            t[0, q, h] -= write
            return t
        with model.hooks(fwd_hooks=[(f"blocks.{l}.attn.hook_z", cut)]):
            moved = target(bf.run()[1])
        assert abs((base - moved) - effect) < TOL


@pytest.fixture(scope="module")
def code_qk():
    from rs_interp import load_toy_model

    model, tcs = load_toy_model("code-2l"), shipped_transcoders("code-2l")
    g = attribution_graph(model, tcs, torch.arange(100, 110), targets=[110], max_feature_nodes=40)
    return model, tcs, g, qk_attributions(model, tcs, g, k=3)


def test_the_graph_json_and_figure_carry_the_qk(code_qk):
    model, tcs, g, qk = code_qk
    # the shipped transcoders' parameters require gradients: no graph entry carries an autograd graph of them
    assert not any(t.requires_grad for t in (g.adjacency, g.values, g.bias, g.unselected, qk[0].query_parts, qk[0].loadings))
    assert len(qk) == 3 and all(abs(float(a.table.sum()) - a.score) < 1e-4 * (1 + abs(a.score)) for a in qk)
    assert [(a.layer, a.head, a.query, a.key) for a in qk] == [e for e, _ in top_attention(model, tcs, g, 3)]
    gq = g.with_qk(qk)
    assert gq.qk == qk and not g.qk
    data = json.loads(json.dumps(graph_json(gq)))
    assert sorted(data) == ["links", "metadata", "nodes", "qParams", "qk"] and "qk" not in graph_json(g)
    ids = {n["node_id"] for n in data["nodes"]}
    entry = data["qk"][0]
    assert entry["layer"] == qk[0].layer and len(entry["entries"]) == 10 and abs(entry["score"] - qk[0].score) < 1e-12
    named = [e["query_source"] for e in entry["entries"]] + [e["key_source"] for e in entry["entries"]]
    labels = set(qk[0].labels)
    assert all(n in ids or n in labels for n in named)
    fig = graph_figure(gq)
    assert "attention (QK)" in [t.name for t in fig.data]
    other = attribution_graph(model, tcs, torch.arange(200, 210), targets=[210])
    with pytest.raises(ValueError, match="another graph"):
        other.with_qk(qk)


def test_refusals(code_qk):
    model, tcs, g, _ = code_qk
    with pytest.raises(ValueError, match="key <= query"):
        qk_attributions(model, tcs, g, [(0, 0, 3, 5)])
    with pytest.raises(ValueError, match="key <= query"):
        qk_attributions(model, tcs, g, [(2, 0, 3, 1)])
    other = random_transcoders(2, 128, 64, seed=1, dtype=torch.float32)
    with pytest.raises(ValueError, match="active features"):
        qk_attributions(model, other, g, [(1, 0, 5, 1)])


def test_inference_mode_is_no_obstacle(code_qk):
    """The QK split's backward passes need autograd: a caller in inference mode gets the same numbers."""
    model, tcs, g, qk = code_qk
    with torch.inference_mode():
        again = qk_attributions(model, tcs, g, [(a.layer, a.head, a.query, a.key) for a in qk[:1]])
        top = top_attention(model, tcs, g, 3)
    assert torch.equal(again[0].table, qk[0].table) and torch.equal(again[0].loadings, qk[0].loadings)
    assert top == top_attention(model, tcs, g, 3)


@pytest.mark.skipif(TL4, reason="TransformerLens 4.3's native models build no ALiBi")
def test_alibi_is_refused_by_the_scores_identity():
    model = make_variant("LN", "alibi", False, seed=1)
    tcs = random_transcoders(2, 16, 24, seed=2)
    tokens = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="scores"):
        g = attribution_graph(model, tcs, tokens, targets=[0])
        qk_attributions(model, tcs, g, [(1, 0, 5, 1)])
