"""Cross-layer transcoders (issue 54 item 3): a graph with a CLT passes the doubling test of the per-layer
graph (float64, 1e-9), by the brute force of tests/features/test_graph.py (``Frozen``: plain hooks, apart from the
library), each feature's write reaching every later MLP output; equals the per-layer graph when the CLT
writes only to its own layer; circuit-tracer's CLT files round-trip; training lowers the error.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from rs_interp.features import CrossLayerTranscoder, attribution_graph, intervene, load_clt, shipped_clt, train_clt
from tests.builders import make_variant
from tests.features.test_graph import Frozen, _rows, assert_columns
from tests.features.test_transcoders import random_transcoders, relu_model

TOL = 1e-9
CASES = [("LN", "standard", "relu", None), ("RMS", "rotary", "jumprelu", None), ("LNPre", "standard", "relu", 25)]


@pytest.mark.parametrize("norm, pos, activation, cap", CASES, ids=[f"{n}-{p}-{a}-{c or 'all'}" for n, p, a, c in CASES])
def test_a_clt_graph_passes_the_doubling_test(norm, pos, activation, cap):
    model = make_variant(norm, pos, False, seed=1, n_layers=3)
    clt = CrossLayerTranscoder.random(3, 16, 20, seed=2, activation=activation, dtype=torch.float64)
    tokens = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, clt, tokens, targets=[0, 7, 21], max_feature_nodes=cap)
    bf = Frozen(model, clt, tokens)
    base = bf.targets(g, *bf.run())
    rows = _rows(g)
    assert torch.allclose(g.values[rows], base, atol=TOL, rtol=0)
    recon = clt.reconstruct(bf.x)  # by the module's formula; the brute force below needs it only for the errors
    for m in range(3):
        y = clt[m].b_dec + sum(clt[l].encode(bf.x[l]) @ clt.decoders[l][:, m - l] for l in range(m + 1))
        assert torch.allclose(recon[m], y, atol=TOL, rtol=0)
        assert torch.allclose(g.errors[m], bf.out[m] - y, atol=TOL, rtol=0)
    feats = [n for n in range(g.n_features) if int(g.features[n, 0]) < 2][:10]
    assert len(feats) >= 5

    def write(n):
        out_delta = torch.zeros(3, 9, 16, dtype=torch.float64)
        l, p, f = g.features[n].tolist()
        for m in range(l, 3):  # the feature writes to its own MLP output and every later one
            out_delta[m, p] = g.activations[n] * clt.decoders[l][f, m - l]
        return out_delta

    assert_columns(bf, g, feats + [g.error_node(0, 4), g.error_node(1, 8), g.token_node(3)], write, base, TOL)
    assert torch.allclose(g.adjacency[rows].sum(1) + g.bias[rows] + g.unselected[rows], base, atol=TOL, rtol=0)
    # the library's own intervention moves the targets as the columns say (frozen), cross-layer writes included
    iv = intervene(model, clt, g, feats[:3], scale=3.0)
    assert iv.gap < TOL


def test_a_clt_writing_only_to_its_own_layer_is_the_per_layer_set():
    model = relu_model("LN", seed=4, n_layers=3)
    tcs = random_transcoders(3, 16, 24, activation="jumprelu", skip=True, seed=5)
    decoders = [torch.cat([tc.W_dec[:, None], torch.zeros(24, 2 - l, 16, dtype=torch.float64)], 1) for l, tc in enumerate(tcs)]
    clt = CrossLayerTranscoder(tcs.transcoders, tcs.input_point, tcs.output_point, "clt", tuple(decoders))
    tokens = torch.randint(0, 50, (10,), generator=torch.Generator().manual_seed(6))
    for cap in (None, 20):
        a = attribution_graph(model, tcs, tokens, max_feature_nodes=cap, max_logits=4)
        b = attribution_graph(model, clt, tokens, max_feature_nodes=cap, max_logits=4)
        for f in ("adjacency", "features", "values", "bias", "unselected", "errors"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f
    # and a CLT with cross-layer writes gives another graph
    noisy = tuple(d.clone() for d in decoders)
    noisy[0][:, 2] = 0.3
    c = attribution_graph(model, CrossLayerTranscoder(tcs.transcoders, scan="clt", decoders=noisy), tokens, max_logits=4)
    assert not torch.equal(c.adjacency, a.adjacency)


@pytest.mark.parametrize("activation", ["relu", "jumprelu"])
def test_circuit_tracers_clt_files_round_trip(activation, tmp_path):
    clt = CrossLayerTranscoder.random(3, 8, 12, seed=1, activation=activation)
    folder = clt.save(tmp_path / "clt")
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["W_dec_0.safetensors", "W_dec_1.safetensors", "W_dec_2.safetensors", "W_enc_0.safetensors",
                     "W_enc_1.safetensors", "W_enc_2.safetensors", "config.yaml"]
    back = load_clt(folder)
    for a, b in zip(clt.decoders, back.decoders):
        assert torch.equal(a, b)
    for a, b in zip(clt, back):
        for name in ("W_enc", "b_enc", "b_dec", "W_dec"):
            assert torch.equal(getattr(a, name), getattr(b, name))
        assert b.activation == activation
    # circuit-tracer's own names, written here without rs_interp: jump_relu, thresholds (1, d_transcoder), no config
    raw = tmp_path / "raw"
    raw.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        save_file({f"W_enc_{i}": torch.randn(6, 4, generator=g), f"b_enc_{i}": torch.zeros(6), f"b_dec_{i}": torch.zeros(4),
                   f"threshold_{i}": torch.rand(1, 6, generator=g)}, str(raw / f"W_enc_{i}.safetensors"))
        save_file({f"W_dec_{i}": torch.randn(6, 2 - i, 4, generator=g)}, str(raw / f"W_dec_{i}.safetensors"))
    (raw / "config.yaml").write_text("model_kind: cross_layer_transcoder\nactivation: jump_relu\nfeature_input_hook: hook_resid_mid\n")
    read = load_clt(raw)
    assert read[0].activation == "jumprelu" and read.input_point == "hook_resid_mid" and tuple(read.decoders[0].shape) == (6, 2, 4)
    (raw / "W_dec_1.safetensors").unlink()
    with pytest.raises(ValueError, match="missing"):
        load_clt(raw)


def test_training_lowers_the_error():
    model = relu_model("LN", seed=5, d_vocab=40, n_ctx=12)
    g = torch.Generator().manual_seed(6)
    tokens, held = torch.randint(0, 40, (48, 12), generator=g), torch.randint(0, 40, (16, 12), generator=g)
    t = train_clt(model, tokens, d_transcoder=32, k=6, steps=150, batch_size=256, lr=3e-3,
                  eval_tokens=held)
    assert t.curve[-1] < 0.6 * t.curve[0] and all(f < 0.8 for f in t.fvu), (t.curve[0], t.curve[-1], t.fvu)


def test_training_refuses_what_it_cannot_train():
    """train_clt checks its recipe as train_transcoder does (it ran a JumpReLU request as TopK, silently)."""
    model, tokens = relu_model(), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="JumpReLU"):
        train_clt(model, tokens, d_transcoder=8, activation="jumprelu")
    with pytest.raises(ValueError, match="d_transcoder, steps and batch_size must be >= 1"):
        train_clt(model, tokens, d_transcoder=8, steps=0)


def test_the_shipped_clt_reconstructs_as_recorded_and_graphs_with_it():
    """code-2l's shipped CLT: its held-out FVU as recorded when trained (recomputed here on fresh windows of the
    same mixture would differ; the record is checked for shape and range), every write reaching the later layer,
    and a graph with it whose rows sum (checked as it is built) and whose errors are the MLP outputs minus it."""
    import json
    from pathlib import Path

    from rs_interp import load_toy_model

    clt = shipped_clt("code-2l")
    record = json.loads((Path(__file__).resolve().parents[2] / "rs_interp/toy_models/transcoders/code-2l-clt/metrics.json").read_text())
    assert len(record["fvu"]) == 2 and all(0 < f < 0.3 for f in record["fvu"]) and record["curve"][-1] < record["curve"][0]
    assert float(clt.decoders[0][:, 1].abs().sum()) > 0
    model = load_toy_model("code-2l")
    g = attribution_graph(model, clt, torch.arange(300, 316), max_logits=2, max_feature_nodes=64)
    assert g.n_active == 2 * 16 * 16
    with pytest.raises(ValueError, match="no cross-layer"):
        shipped_clt("gpt2")
