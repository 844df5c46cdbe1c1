"""Other libraries' transcoder files (issue 54 item 5): files written here in pchlenski's and sparsify's layouts
from random weights, read, and compared with each format's own formula written out by hand; then converted to
circuit-tracer's files and read back; a graph made with the read set is exact (its doubling test is the
per-layer or cross-layer one, here the row sums)."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from safetensors.torch import save_file

from rs_interp.features import CrossLayerTranscoder, attribution_graph, load_clt, load_transcoders
from rs_interp.features.formats import convert_to_circuit_tracer, load_pchlenski_transcoders, load_sparsify_transcoders
from tests.features.test_transcoders import relu_model

D, W, L = 16, 24, 2


def _pchlenski_files(tmp_path, *, as_object: bool, hook=None):
    """One .pt a layer as transcoder_circuits saves them; the config a pickled sae_training object (its
    module present only while saving) or a dict."""
    g = torch.Generator().manual_seed(0)
    files, raw = [], []
    if as_object:
        mod = types.ModuleType("sae_training.config")
        cls = type("LanguageModelSAERunnerConfig", (), {"__module__": "sae_training.config"})
        mod.LanguageModelSAERunnerConfig = cls
        sys.modules["sae_training"], sys.modules["sae_training.config"] = types.ModuleType("sae_training"), mod
    try:
        for l in range(L):
            sd = {"W_enc": torch.randn(D, W, generator=g) * 0.3, "b_enc": torch.randn(W, generator=g) * 0.1 - 0.1,
                  "W_dec": torch.randn(W, D, generator=g) * 0.3, "b_dec": torch.randn(D, generator=g) * 0.2,
                  "b_dec_out": torch.randn(D, generator=g) * 0.2}
            fields = {"hook_point": hook or f"blocks.{l}.ln2.hook_normalized", "hook_point_layer": l, "d_in": D, "d_out": D,
                      "out_hook_point": f"blocks.{l}.hook_mlp_out", "is_transcoder": True}
            if as_object:
                cfg = cls()
                cfg.__dict__.update(fields)
            else:
                cfg = fields
            path = tmp_path / f"final_sparse_autoencoder_gpt2-small_blocks.{l}.ln2.hook_normalized_{W}.pt"
            torch.save({"cfg": cfg, "state_dict": sd}, path)
            files.append(path)
            raw.append(sd)
    finally:
        if as_object:
            del sys.modules["sae_training"], sys.modules["sae_training.config"]
    return files, raw


@pytest.mark.parametrize("as_object", [True, False], ids=["pickled-config", "dict-config"])
def test_pchlenskis_transcoders(tmp_path, as_object):
    files, raw = _pchlenski_files(tmp_path, as_object=as_object)
    tcs = load_pchlenski_transcoders(files, dtype=torch.float64)
    assert tcs.input_point == "ln2.hook_normalized" and len(tcs) == L
    x = torch.randn(7, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for tc, sd in zip(tcs, raw):
        s = {k: v.double() for k, v in sd.items()}
        by_hand = torch.relu((x - s["b_dec"]) @ s["W_enc"] + s["b_enc"]) @ s["W_dec"] + s["b_dec_out"]
        assert torch.allclose(tc(x), by_hand, atol=1e-12, rtol=0)
    back = load_transcoders(convert_to_circuit_tracer(tcs, tmp_path / "ct"), dtype=torch.float64)
    assert back.input_point == "ln2.hook_normalized" and torch.equal(back[1].W_enc, tcs[1].W_enc)
    model = relu_model("LN", seed=3, n_layers=L, d_model=D)
    g = attribution_graph(model, back, torch.arange(8), max_logits=3)
    rows = g.target_nodes()
    assert torch.allclose(g.rows().sum(1) + g.bias[rows], g.values[rows], atol=1e-9, rtol=0)
    (tmp_path / "other").mkdir()
    bad, _ = _pchlenski_files(tmp_path / "other", as_object=False, hook="blocks.0.hook_resid_pre")
    with pytest.raises(ValueError, match="ln2.hook_normalized"):
        load_pchlenski_transcoders(bad)


def _sparsify_folder(folder, n_targets: int | None, *, skip=False, k=4):
    g = torch.Generator().manual_seed(2)
    raw = []
    for l in range(L):
        sub = folder / f"layers.{l}.mlp"
        sub.mkdir(parents=True)
        sd = {"encoder.weight": torch.randn(W, D, generator=g) * 0.3, "encoder.bias": torch.randn(W, generator=g) * 0.1}
        cfg = {"d_in": D, "k": k, "transcode": True, "skip_connection": skip, "expansion_factor": W // D, "activation": "topk"}
        if n_targets:
            t = min(n_targets, L - l)
            cfg["n_targets"] = t
            for j in range(t):
                sd[f"W_decs.{j}"] = torch.randn(W, D, generator=g) * 0.3
                sd[f"b_decs.{j}"] = torch.randn(D, generator=g) * 0.2
        else:
            sd["W_dec"], sd["b_dec"] = torch.randn(W, D, generator=g) * 0.3, torch.randn(D, generator=g) * 0.2
        if skip:
            sd["W_skip"] = torch.randn(D, D, generator=g) * 0.1
        (sub / "cfg.json").write_text(json.dumps(cfg))
        save_file(sd, str(sub / "sae.safetensors"))
        raw.append(sd)
    return raw


def _topk(pre, k):
    idx = pre.topk(k, -1).indices
    return torch.zeros_like(pre).scatter(-1, idx, pre.gather(-1, idx))


@pytest.mark.parametrize("skip", [False, True])
def test_sparsifys_per_layer_transcoders(tmp_path, skip):
    raw = _sparsify_folder(tmp_path / "sp", None, skip=skip)
    tcs = load_sparsify_transcoders(tmp_path / "sp", dtype=torch.float64)
    x = torch.randn(5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for tc, sd in zip(tcs, raw):
        s = {k: v.double() for k, v in sd.items()}
        by_hand = _topk(x @ s["encoder.weight"].T + s["encoder.bias"], 4) @ s["W_dec"] + s["b_dec"]
        if skip:
            by_hand = by_hand + x @ s["W_skip"].T
        assert torch.allclose(tc(x), by_hand, atol=1e-12, rtol=0)
    back = load_transcoders(convert_to_circuit_tracer(tcs, tmp_path / "ct"), dtype=torch.float64)
    assert back[0].k == 4 and torch.equal(back[0].W_dec, tcs[0].W_dec)


def test_sparsifys_cross_layer_transcoders(tmp_path):
    raw = _sparsify_folder(tmp_path / "clt", 2)
    clt = load_sparsify_transcoders(tmp_path / "clt", dtype=torch.float64)
    assert isinstance(clt, CrossLayerTranscoder)
    x = [torch.randn(5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(l)) for l in range(L)]
    acts = [_topk(x[l] @ raw[l]["encoder.weight"].double().T + raw[l]["encoder.bias"].double(), 4) for l in range(L)]
    for m, y in enumerate(clt.reconstruct(x)):  # output m: every source l <= m through its decoder j = m - l, plus its bias
        by_hand = sum(acts[l] @ raw[l][f"W_decs.{m - l}"].double() + raw[l][f"b_decs.{m - l}"].double() for l in range(m + 1))
        assert torch.allclose(y, by_hand, atol=1e-12, rtol=0)
    back = load_clt(convert_to_circuit_tracer(clt, tmp_path / "ct"), dtype=torch.float64)
    for a, b in zip(clt.decoders, back.decoders):
        assert torch.equal(a, b)
    model = relu_model("LN", seed=3, n_layers=L, d_model=D)
    g = attribution_graph(model, back, torch.arange(8), max_logits=3)
    rows = g.target_nodes()
    assert torch.allclose(g.rows().sum(1) + g.bias[rows], g.values[rows], atol=1e-9, rtol=0)


def test_sparsify_refusals(tmp_path):
    _sparsify_folder(tmp_path / "a", None)
    cfg = tmp_path / "a" / "layers.1.mlp" / "cfg.json"
    cfg.write_text(json.dumps(json.loads(cfg.read_text()) | {"transcode": False}))
    with pytest.raises(ValueError, match="autoencoder"):
        load_sparsify_transcoders(tmp_path / "a")
    with pytest.raises(ValueError, match="no hook-point folder"):
        load_sparsify_transcoders(tmp_path / "a" / "layers.1.mlp")
