"""Issue 53 item 3: an attribution graph computed by circuit-tracer itself equals rs_interp's computed with
``convention="circuit-tracer"`` (position 0 zeroed, BOS prepended, its feature rounds and node order).

Marked ``reference``: CI never runs these; ``bash scripts/test_circuit_tracer.sh`` makes circuit-tracer's
venv (its pins, ``transformers<=4.57.3`` and TransformerLens 2.x, cannot share rs_interp's) and runs them,
each calling scripts/reference_circuit_tracer.py there on a random model, a random transcoder set written
here in circuit-tracer's format (read by its own loader) and a prompt. Without ``RS_CT_PYTHON`` they skip.

What they show, the model in float64 on both sides (circuit-tracer stores its edge matrix in float32, so
entries agree to float32 rounding: 1e-6 of the largest entry), and in float32 on both (1e-4 of the largest):
the prompt (BOS prepended), the active features, the features kept under a cap and their order, the
activations, the adjacency, the logit nodes, the pruning's node and edge masks and cumulative influence,
the replacement and completeness scores, and the graph JSON its ``create_graph_files`` writes: the same
nodes (ids, fields), the same links, weights and influences to rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import rs_interp as ri
from rs_interp import _backend
from rs_interp.features import attribution_graph
from rs_interp.features.export import graph_json
from tests.features.test_transcoders import random_transcoders, relu_model

pytestmark = [pytest.mark.reference,
              pytest.mark.skipif(not os.environ.get("RS_CT_PYTHON"), reason="RS_CT_PYTHON (scripts/test_circuit_tracer.sh) not set")]

ROOT = Path(__file__).resolve().parents[2]
D_VOCAB = 50
#: <bos>, <eos>, <pad> at 1, 2, 3 (not 0: circuit-tracer's ``next(filter(None, candidates))`` passes over an id 0, and
#: takes the pad token then), words, some with whitespace (circuit-tracer writes its tokens' text as decoded)
VOCAB = ["w0", "<bos>", "<eos>", "<pad>"] + [f"w{i}" + ("\n" if i % 7 == 0 else "\t" if i % 11 == 0 else "") for i in range(4, D_VOCAB)]
SPECIAL = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
#: (name, max_feature_nodes, batch_size, update_interval): every feature; a cap chosen in rounds of 2; a cap in one round
RUNS = [("full", None, 8, 4), ("cap-rounds", 24, 2, 1), ("cap", 24, 512, 4)]
NUMBERS = ("influence", "activation", "token_prob")  # compared to rounding, every other field exactly
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}  # of the largest |entry|: float32 storage there, float32 model both


def _setup(tmp: Path, dtype, activation):
    model = ri.as_dtype(relu_model("LN", seed=1, d_vocab=D_VOCAB, n_ctx=16), dtype)
    tcs = random_transcoders(2, 16, 32, activation=activation, skip=activation == "jumprelu", seed=2, dtype=dtype, k=6)
    tcs.save(tmp / "transcoders")
    cfg = {k: v for k, v in _backend.config_of(model).items() if v is not None}
    cfg["dtype"] = str(cfg["dtype"]).replace("torch.", "")
    torch.save({"cfg": cfg, "state": _backend.portable_state(model)}, tmp / "model.pt")
    tokens = torch.randint(4, D_VOCAB, (11,), generator=torch.Generator().manual_seed(5))
    # circuit-tracer's tokenizer as rs_interp reads it: BOS, pad, EOS and the special ids
    model.tokenizer = SimpleNamespace(bos_token_id=1, pad_token_id=3, eos_token_id=2, all_special_ids=[1, 2, 3], padding_side="right")
    return model, tcs, tokens


def _reference(tmp: Path, tokens) -> dict:
    request = {"model": str(tmp / "model.pt"), "transcoders": str(tmp / "transcoders"), "vocab": VOCAB, "special": SPECIAL,
               "tokens": tokens.tolist(), "out": str(tmp / "ct"),
               "runs": [{"name": n, "max_feature_nodes": m, "batch_size": b, "update_interval": u} for n, m, b, u in RUNS]}
    (tmp / "request.json").write_text(json.dumps(request))
    run = subprocess.run([os.environ["RS_CT_PYTHON"], str(ROOT / "scripts" / "reference_circuit_tracer.py"), str(tmp / "request.json")],
                         capture_output=True, text=True, timeout=1200, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _close(ours, theirs, tol, what):
    ours, theirs = torch.as_tensor(ours, dtype=torch.float64), torch.as_tensor(theirs, dtype=torch.float64)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    scale = float(theirs.abs().max()) if theirs.numel() else 0.0
    gap = float((ours - theirs).abs().max()) if theirs.numel() else 0.0
    print(f"  {what}: max |ours - circuit-tracer| {gap:.3g} (largest |value| {scale:.3g})")
    assert gap <= tol * max(scale, 1.0), what
    return gap


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_circuit_tracers_graph_is_ours(tmp_path, dtype, activation):
    model, tcs, tokens = _setup(tmp_path, dtype, activation)
    report = _reference(tmp_path, tokens)
    assert report["zero_positions"] == [0, 1]
    tol = TOLERANCE[dtype]
    for name, cap, batch, interval in RUNS:
        ref = load_file(str(tmp_path / "ct" / f"{name}.safetensors"))
        g = attribution_graph(model, tcs, tokens, convention="circuit-tracer", max_feature_nodes=cap, batch_size=min(batch, 64),
                              round_size=batch * interval)
        print(f"{activation} {dtype} {name}: {g.n_features} of {g.n_active} features, {g.n_nodes} nodes")
        assert torch.equal(g.tokens, ref["input_tokens"].long()) and int(g.tokens[0]) == 1  # BOS prepended
        assert g.zero_positions == (0,) and bool((g.errors[:, 0] == 0).all())
        active = ref["active_features"].long()
        assert g.n_active == len(active) and int((active[:, 1] == 0).sum()) == 0  # nothing active at position 0 there
        selected = active[ref["selected_features"].long()]
        assert torch.equal(g.features, selected), "the kept features and their order"
        _close(g.activations, ref["activation_values"][ref["selected_features"].long()], 1e-12 if dtype == torch.float64 else 1e-6, "activations")
        assert torch.equal(g.logit_tokens, ref["logit_tokens"].long())
        _close(g.logit_probabilities, ref["logit_probabilities"], 1e-6, "logit probabilities")
        A = g.dense_adjacency()
        _close(A, ref["adjacency"], tol, "adjacency")
        pruned = g.prune(0.8, 0.98)
        _close(pruned.cumulative, ref["cumulative"], 10 * tol, "cumulative influence")
        assert torch.equal(pruned.nodes, ref["node_mask"].bool()), "pruning: nodes"
        edges = pruned.edges.dense() if hasattr(pruned.edges, "dense") else pruned.edges
        differ = int((edges != ref["edge_mask"].bool()).sum())
        print(f"  pruning: {differ} of {int(edges.sum())} edges differ")
        assert differ == 0, "pruning: edges"
        s = g.scores()
        ct = report["runs"][name]
        _close(torch.tensor([s.replacement, s.completeness]), torch.tensor([ct["replacement"], ct["completeness"]]), 10 * tol, "scores")
        # the JSON its create_graph_files writes, and ours with the same text
        theirs = json.loads((tmp_path / "ct" / name / f"{name}.json").read_text())
        ours = graph_json(g, slug=name, decode=lambda t: report["token_text"][t], prompt=ct["input_string"])
        assert ours["metadata"] == theirs["metadata"]
        back = {}  # our error ids where circuit-tracer's collide with a layer-0 feature's, to its id
        for n in ours["nodes"]:
            if n["feature_type"] == "mlp reconstruction error" and "_-1_" in n["node_id"]:
                back[n["node_id"]] = f"0_{n['layer']}_{n['ctx_idx']}"
        ids = [n["node_id"] for n in theirs["nodes"]]
        print(f"  JSON: {len(ids)} nodes, {len(ids) - len(set(ids))} ids twice in circuit-tracer's file; ours unique, "
              f"{len(back)} error ids changed")
        assert len(ids) - len(set(ids)) == len(back) and len({n["node_id"] for n in ours["nodes"]}) == len(ours["nodes"])
        assert [back.get(n["node_id"], n["node_id"]) for n in ours["nodes"]] == ids
        for n, t in zip(ours["nodes"], theirs["nodes"]):
            if n["node_id"] in back:
                n = n | {"node_id": back[n["node_id"]], "jsNodeId": f"{n['layer']}_{n['ctx_idx']}-0"}
            assert {k: v for k, v in n.items() if k not in NUMBERS} == \
                   {k: v for k, v in t.items() if k not in NUMBERS}, n["node_id"]
            for k in NUMBERS:
                assert (n[k] is None) == (t[k] is None) and (n[k] is None or abs(n[k] - t[k]) <= 10 * tol), (n["node_id"], k)
        pairs = [(back.get(x["source"], x["source"]), back.get(x["target"], x["target"])) for x in ours["links"]]
        assert pairs == [(x["source"], x["target"]) for x in theirs["links"]]
        _close([x["weight"] for x in ours["links"]], [x["weight"] for x in theirs["links"]], tol, "link weights")
