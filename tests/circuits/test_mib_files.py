"""MIB's graph files (rs_interp.circuits.mib_files, .mib_names): MIB's names of every edge and back, the files
round-tripped in both formats and both conventions, the loss's score, EAP-IG's weighted edge count, the submission's
circuit sizes, EAP-IG's token graph, the refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits import (
    MIBGraph,
    from_mib_edge,
    mib_edge_names,
    mib_importances,
    read_mib,
    write_mib,
    write_mib_circuits,
)

# --- MIB's graph files -------------------------------------------------------------------------


def _models():
    return {"induction-2l": ri.load_toy_model("induction-2l").cfg, "gpt2-small": ri.models.gpt2_config("small"),
            "gqa": ri.models.make_attn_only(2, n_heads=4, n_key_value_heads=2, d_head=8, d_model=32).cfg}


@pytest.mark.parametrize("which", ["induction-2l", "gpt2-small", "gqa"])
def test_mib_names_round_trip(which):
    cfg = _models()[which]
    layout = ri.edge_layout(cfg)
    names = [n for e in layout.edges() for n in mib_edge_names(e, cfg)]
    assert len(names) == len(set(names))
    assert all(from_mib_edge(n, cfg) == e for e in layout.edges() for n in mib_edge_names(e, cfg))
    if which == "gpt2-small":  # MIB's GPT-2 small graph (its example importance file): 32,491 edges
        assert len(names) == 32491 and {"input->a0.h0<q>", "a0.h0->m0", "m11->logits", "a11.h11->logits"} <= set(names)


@pytest.mark.parametrize("which", ["induction-2l", "gpt2-small", "gqa"])
def test_mib_edge_check_agrees_with_the_layout(which):
    """from_mib_edge validates from the config alone: against the layout, on every (sender, receiver) pair."""
    from rs_interp.circuits.mib_names import _check_edge

    cfg = _models()[which]
    layout = ri.edge_layout(cfg)
    stride = 7 if which == "gpt2-small" else 1  # a sample of GPT-2's 70k pairs keeps this fast
    for i, s in enumerate(layout.senders):
        for j in range(i % stride, len(layout.receivers), stride):
            r = layout.receivers[j]
            if bool(layout.exists[i, j]):
                _check_edge(s, r, cfg)
            else:
                with pytest.raises(ValueError, match="is not an edge"):
                    _check_edge(s, r, cfg)
    for s, r in [("L9H0", "logits"), ("embed", "L0H9.q"), ("MLP0", "logits"), ("embed", "L0KV0.k"), ("embed", "logits.q")]:
        if s in layout.senders and r in layout.receivers:
            continue
        with pytest.raises(ValueError, match="is not a (sender|receiver) of this model"):
            _check_edge(s, r, cfg)


def _random_scores(cfg, seed=0):
    layout = ri.edge_layout(cfg)
    effect = torch.randn(layout.exists.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return ri.circuits.EdgeEffects(layout, torch.where(layout.exists, effect.float().double(), torch.nan), float("nan"))


@pytest.mark.parametrize("suffix", [".json", ".pt"])
@pytest.mark.parametrize("which", ["induction-2l", "gqa"])  # GPT-2 small's names and count: test_mib_names_round_trip
def test_mib_files_round_trip(tmp_path, which, suffix):
    cfg = _models()[which]
    scores = _random_scores(cfg)
    back = read_mib(write_mib(tmp_path / f"as_given{suffix}", cfg, scores=scores, convention="as given"), cfg)
    assert isinstance(back, MIBGraph) and torch.equal(back.scores.effect.isnan(), scores.effect.isnan())
    assert torch.equal(back.scores.effect.nan_to_num(0), scores.effect.nan_to_num(0))
    assert back.convention == {"convention": "as given"} and back.effects() is back.scores
    back = read_mib(write_mib(tmp_path / f"importances{suffix}", cfg, scores=scores, batch_size=4), cfg)
    assert torch.equal(back.effects().effect.nan_to_num(0), scores.effect.nan_to_num(0))  # -(-e / 4) * 4: exact
    assert back.circuit == frozenset(ri.edge_layout(cfg).edges())
    circuit = ri.top_edges(scores, 7)
    again = read_mib(write_mib(tmp_path / f"circuit{suffix}", cfg, circuit=circuit), cfg)
    assert again.circuit == set(circuit)
    assert set(ri.top_edges(again.scores, 7)) == set(circuit)  # scores 1 inside, 0 outside: the top-7 is the circuit


@pytest.mark.parametrize("higher_is_better", [True, False])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_mib_convention_is_the_loss_score(tmp_path, higher_is_better, batch_size):
    """MIB's harness scores the loss (mean=True, loss=True): the file's score of each edge is -effect / B for a
    higher-is-better metric and effect / B for a loss, per MIB name (read raw from the JSON here)."""
    cfg = _models()["gqa"]
    scores = _random_scores(cfg, seed=batch_size)
    data = json.loads(write_mib(tmp_path / "i.json", cfg, scores=scores, higher_is_better=higher_is_better,
                                batch_size=batch_size).read_text())
    assert data["rs_interp"] == {"convention": "mib", "higher_is_better": higher_is_better, "batch_size": batch_size}
    for e in ri.edge_layout(cfg).edges():
        want = (-1 if higher_is_better else 1) * scores.edge(*e) / batch_size
        assert all(data["edges"][n]["score"] == want for n in mib_edge_names(e, cfg))
    back = read_mib(tmp_path / "i.json", cfg)
    assert torch.allclose(back.effects().effect.nan_to_num(0), scores.effect.nan_to_num(0), rtol=1e-15, atol=0)
    # a file written elsewhere (no record): MIB's metrics are higher-is-better, B defaults to 1
    del data["rs_interp"]
    (tmp_path / "theirs.json").write_text(json.dumps(data))
    theirs = read_mib(tmp_path / "theirs.json", cfg)
    assert theirs.convention == {}
    assert torch.equal(theirs.effects().effect.nan_to_num(0), (-theirs.scores.effect).nan_to_num(0))
    assert torch.equal(theirs.effects(higher_is_better=False, batch_size=2).effect.nan_to_num(0), (2 * theirs.scores.effect).nan_to_num(0))


def test_mib_importances_refusals():
    cfg = _models()["induction-2l"]
    with pytest.raises(ValueError, match="EdgeEffects"):
        mib_importances(torch.zeros(3))
    with pytest.raises(ValueError, match="higher_is_better"):
        mib_importances(_random_scores(cfg), higher_is_better=1)


@pytest.mark.parametrize("suffix", [".json", ".pt"])
@pytest.mark.parametrize("masked", [False, True])
def test_mib_weighted_edge_count(tmp_path, suffix, masked):
    """EAP-IG's Graph.weighted_edge_count: in-graph edges, each weighted by its parent's kept neurons / d_model where
    the file has neuron masks (a parent without a mask counts 0, as EAP-IG's zero-initialised masks do)."""
    cfg = _models()["gqa"]
    circuit = ri.top_edges(_random_scores(cfg, seed=5), 9)
    path = write_mib(tmp_path / f"c{suffix}", cfg, circuit=circuit)
    names = {n for e in circuit for n in mib_edge_names(e, cfg)}
    masks = {}
    if masked:
        gen = torch.Generator().manual_seed(1)
        masks = {node: torch.rand(cfg.d_model, generator=gen) < 0.4 for node in ("input", "a0.h0", "a0.h1", "a0.h2")}
        if suffix == ".json":
            data = json.loads(path.read_text())
            for node, m in masks.items():
                data["nodes"][node]["neurons"] = m.tolist()
            path.write_text(json.dumps(data))
        else:
            data = torch.load(path, weights_only=True)
            data["neurons_in_graph"] = torch.stack([masks.get(n, torch.zeros(cfg.d_model, dtype=torch.bool)) for n in data["src_nodes"]])
            torch.save(data, path)
    g = read_mib(path, cfg)
    assert g.in_graph == names
    brute = 0.0
    for name in names:
        parent = name.split("->")[0]
        brute += (int(masks[parent].sum()) / cfg.d_model if parent in masks else 0.0) if masked else 1.0
    assert g.weighted_edge_count() == pytest.approx(brute, rel=1e-12)


def test_mib_json_nodes_follow_the_circuit(tmp_path):
    cfg = _models()["induction-2l"]
    data = json.loads(write_mib(tmp_path / "c.json", cfg, circuit=[("embed", "L0H1.v"), ("L0H1", "L1H0.k")]).read_text())
    assert data["cfg"] == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": cfg.d_model}
    assert {n for n, d in data["nodes"].items() if d["in_graph"]} == {"input", "a0.h1", "a1.h0", "logits"}
    assert data["edges"]["input->a0.h1<v>"] == {"score": 1.0, "in_graph": True}
    assert data["edges"]["a0.h0->a1.h0<k>"] == {"score": 0.0, "in_graph": False}


def test_mib_circuits_at_the_submission_sizes(tmp_path):
    cfg = _models()["gqa"]
    scores = _random_scores(cfg, seed=2)
    total = sum(len(mib_edge_names(e, cfg)) for e in ri.edge_layout(cfg).edges())
    paths = write_mib_circuits(tmp_path, cfg, scores, fractions=(0.05, 0.2, 0.5))
    previous: frozenset = frozenset()
    for f, path in zip((0.05, 0.2, 0.5), paths):
        circuit = read_mib(path, cfg).circuit
        used = sum(len(mib_edge_names(e, cfg)) for e in circuit)
        assert used <= int(f * total) and previous <= circuit  # at most f of MIB's edges; nested
        best_left = max((abs(scores.edge(*e)) for e in set(ri.edge_layout(cfg).edges()) - circuit), default=0)
        assert all(abs(scores.edge(*e)) >= best_left for e in circuit)  # the largest |score| first
        previous = circuit
    plain = _models()["induction-2l"]
    n_plain = ri.edge_layout(plain).n_edges
    sizes = [len(read_mib(p, plain).circuit) for p in write_mib_circuits(tmp_path / "p", plain, _random_scores(plain))]
    assert sizes == [int(f * n_plain) for f in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)]


def test_mib_refusals(tmp_path):
    cfg, gqa = _models()["induction-2l"], _models()["gqa"]
    scores = _random_scores(cfg)
    with pytest.raises(ValueError, match="no score"):
        write_mib(tmp_path / "x.json", cfg, scores=ri.circuits.EdgeEffects(scores.layout, torch.full_like(scores.effect, math.nan), math.nan))
    with pytest.raises(ValueError, match="not a receiver"):
        write_mib(tmp_path / "x.json", cfg, circuit=[("embed", "MLP0")])
    path = write_mib(tmp_path / "ok.json", cfg, scores=scores)
    with pytest.raises(ValueError, match="graph of another model"):
        read_mib(path, ri.models.gpt2_config("small"))
    data = json.loads(path.read_text())
    data["edges"]["input->m0"] = {"score": 0.5, "in_graph": True}  # an MLP this attention-only model has not
    (tmp_path / "mlp.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="MLP0"):
        read_mib(tmp_path / "mlp.json", cfg)
    g = json.loads(write_mib(tmp_path / "g.json", gqa, scores=_random_scores(gqa)).read_text())
    g["edges"]["input->a0.h1<k>"]["score"] += 1.0  # query heads 0 and 1 share KV head 0: their copies must agree
    (tmp_path / "g.json").write_text(json.dumps(g))
    with pytest.raises(ValueError, match="one key and one value input per KV head.*ungroup_gqa"):
        read_mib(tmp_path / "g.json", gqa)
    with pytest.raises(ValueError, match="convention must be"):
        write_mib(tmp_path / "x.json", cfg, scores=scores, convention="loss")
    with pytest.raises(ValueError, match="batch_size"):
        write_mib(tmp_path / "x.json", cfg, scores=scores, batch_size=0)
    del data["edges"]["input->m0"], data["edges"]["input->a0.h0<q>"]
    (tmp_path / "short.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="lacks 1 edges"):
        read_mib(tmp_path / "short.json", cfg)


def test_mib_files_from_eap_igs_graph(tmp_path):
    """Scores and circuits on edge_layout(model, embedding="token") write the same file (tok_embed is MIB's input);
    the split graph's pos_embed has no MIB name."""
    cfg = ri.models.make_attn_only(2, n_heads=2, positional_embedding_type="standard").cfg
    scores = _random_scores(cfg, seed=3)
    token = scores.on_inputs("token")
    a = write_mib(tmp_path / "a.json", cfg, scores=scores).read_text()
    assert write_mib(tmp_path / "b.json", cfg, scores=token).read_text() == a
    circuit = ri.top_edges(scores, 6)
    c = write_mib(tmp_path / "c.json", cfg, circuit=circuit).read_text()
    moved = [("tok_embed" if s == "embed" else s, r) for s, r in circuit]
    assert write_mib(tmp_path / "d.json", cfg, circuit=moved).read_text() == c
    with pytest.raises(ValueError, match="not 'split'"):
        write_mib(tmp_path / "e.json", cfg, scores=scores.on_inputs("split"))
