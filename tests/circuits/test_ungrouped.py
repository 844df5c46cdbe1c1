"""Issue 53 item 1: grouped-query attention ungrouped as MIB scores it (rs_interp.circuits.ungrouped)."""

import json

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits import mib_edge_names, read_mib, write_mib

VARIANTS = {
    "attn-only": dict(),
    "mlp": dict(attn_only=False, d_mlp=64, act_fn="gelu"),
    "rotary": dict(positional_embedding_type="rotary"),
}


def _gqa(which, n_layers=2, dtype=torch.float64):
    model = ri.models.make_attn_only(n_layers, n_heads=4, n_key_value_heads=2, d_head=8, d_model=32, seed=3, **VARIANTS[which])
    return ri.as_dtype(model, dtype)


def _tokens(model, seed, shape=(3, 7)):
    return torch.randint(0, model.cfg.d_vocab, shape, generator=torch.Generator().manual_seed(seed))


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 3].mean() - logits[:, -1, 4].mean()


@pytest.mark.parametrize("which", list(VARIANTS))
def test_same_function_and_one_kv_input_per_query_head(which):
    model = _gqa(which)
    flat = ri.circuits.ungroup_gqa(model)
    toks = _tokens(model, 0)
    with torch.no_grad():
        assert torch.allclose(flat(toks), model(toks), atol=1e-12, rtol=0)
    per = 2
    mine, theirs = ri._backend.portable_state(flat), ri._backend.portable_state(model)
    for l in range(model.cfg.n_layers):  # query head h reads KV head h // per: its W_K, W_V are that head's
        for h in range(4):
            for w in ("W_K", "W_V", "b_K", "b_V"):
                assert torch.equal(mine[f"blocks.{l}.attn.{w}"][h], theirs[f"blocks.{l}.attn._{w}"][h // per])
    layout = ri.edge_layout(flat)
    assert [r for r in layout.receivers if r.startswith("L0")][:6] == ["L0H0.q", "L0H0.k", "L0H0.v", "L0H1.q", "L0H1.k", "L0H1.v"]
    # MIB's count: the grouped graph's edges, each KV edge once per query head reading it
    grouped = ri.edge_layout(model)
    assert layout.n_edges == sum(len(mib_edge_names(e, model)) for e in grouped.edges())


@pytest.mark.parametrize("which", ["attn-only", "mlp"])
def test_copies_add_up_to_the_kv_edge(which):
    """First order, a KV edge's score on the grouped model is the sum of its copies' scores on the ungrouped one
    (the gradient at the shared input is the sum of the query heads' gradients)."""
    model = _gqa(which)
    flat = ri.circuits.ungroup_gqa(model)
    toks, ref = _tokens(model, 1), _tokens(model, 2)
    grouped = ri.edge_attribution_patching(model, toks, metric, reference=ref, progress=False)
    copies = ri.edge_attribution_patching(flat, toks, metric, reference=ref, progress=False)
    for s, r in grouped.layout.edges():
        if "KV" in r:
            layer, g, x = int(r[1:r.index("KV")]), int(r.split("KV")[1].split(".")[0]), r[-1]
            total = sum(copies.edge(s, f"L{layer}H{h}.{x}") for h in (2 * g, 2 * g + 1))
            assert grouped.edge(s, r) == pytest.approx(total, abs=1e-12, rel=1e-10)
        else:
            assert grouped.edge(s, r) == pytest.approx(copies.edge(s, r), abs=1e-12, rel=1e-10)


@pytest.mark.parametrize("suffix", [".json", ".pt"])
def test_mib_gqa_files_read_onto_the_ungrouped_model(tmp_path, suffix):
    model = _gqa("attn-only", dtype=torch.float32)
    flat = ri.circuits.ungroup_gqa(model)
    layout = ri.edge_layout(flat)
    effect = torch.randn(layout.exists.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64).float().double()
    scores = ri.circuits.EdgeEffects(layout, torch.where(layout.exists, effect, torch.nan), float("nan"))
    path = write_mib(tmp_path / f"gqa{suffix}", flat, scores=scores, convention="as given")
    names = set(json.loads(path.read_text())["edges"]) if suffix == ".json" else None
    if names is not None:  # the same names as the grouped model's file: MIB's graph of either
        assert names == {n for e in ri.edge_layout(model).edges() for n in mib_edge_names(e, model)}
    back = read_mib(path, flat)
    assert torch.equal(back.scores.effect.nan_to_num(0), scores.effect.nan_to_num(0))
    with pytest.raises(ValueError, match="ungroup_gqa"):
        read_mib(path, model)  # the copies differ: the grouped graph cannot hold them


def test_partial_kv_groups_at_a_budget():
    """On the ungrouped model each copy is one edge: a budget may keep part of a KV group, and the full group of
    copies evaluates as the grouped model's KV edge."""
    model = _gqa("attn-only")
    flat = ri.circuits.ungroup_gqa(model)
    toks, ref = _tokens(model, 5), _tokens(model, 6)
    grouped_all = ri.edge_layout(model).edges()
    keep_grouped = [e for e in grouped_all if e != ("L0H1", "L1KV0.k")]
    keep_flat = [e for e in ri.edge_layout(flat).edges() if e not in {("L0H1", "L1H0.k"), ("L0H1", "L1H1.k")}]
    a = ri.evaluate_circuit(model, toks, metric, keep_grouped, reference=ref)
    b = ri.evaluate_circuit(flat, toks, metric, keep_flat, reference=ref)
    assert a == pytest.approx(b, abs=1e-12)
    half = ri.evaluate_circuit(flat, toks, metric, keep_flat + [("L0H1", "L1H0.k")], reference=ref)
    full = ri.evaluate_circuit(flat, toks, metric, ri.edge_layout(flat).edges(), reference=ref)
    assert half not in (pytest.approx(a, abs=1e-9), pytest.approx(full, abs=1e-9))  # a partial group: neither
    eap = ri.edge_attribution_patching(flat, toks, metric, reference=ref, progress=False)
    curve = ri.faithfulness_curve(flat, toks, metric, eap, reference=ref, progress=False, fractions=(0.1, 0.5, 1.0))
    assert curve.n_requested == tuple(int(f * ri.edge_layout(flat).n_edges) for f in (0.1, 0.5, 1.0))


def test_refusals():
    with pytest.raises(ValueError, match="no grouped-query attention"):
        ri.circuits.ungroup_gqa(ri.models.make_attn_only(1))
    with pytest.raises(ValueError, match="TransformerLens model"):
        ri.circuits.ungroup_gqa("gpt2")
