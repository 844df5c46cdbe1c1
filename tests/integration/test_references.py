"""Issue 53: rs_interp's files through the reference code itself, MIB's circuit-track harness and EAP-IG.

Marked ``reference``: CI never runs these (scripts/test.sh leaves them out); ``bash
scripts/test_references.sh`` makes the reference venv (TransformerLens 2.x, EAP-IG at the commit MIB
pins, MIB-circuit-track) and runs them, each calling scripts/reference_mib.py there on the model, the
data and the files written here. Without ``RS_REF_PYTHON`` they skip.

What they show, in float64 on both sides:
- MIB's own EAP attribution (``loss=True, mean=True``) writes the scores :func:`rs_interp.circuits.write_mib`
  writes by default (``-effect / B``, B its batch size);
- MIB's ``evaluate_area_under_curve`` on our importance file gives our curve point by point, our
  CPR (``higher_is_better=True``) and CMD, and our edge counts;
- on a grouped-query attention model, MIB's curve is the one of :func:`rs_interp.circuits.ungroup_gqa`'s copy
  (partial KV groups at a budget included), and MIB's own scores are that copy's EAP;
- EAP-IG's ``evaluate_graph`` with zero and position-mean ablation equals :func:`rs_interp.evaluate_circuit`
  on the graph whose input node is the token embedding alone (``edge_layout(model, embedding="token")``),
  and MIB's curves under those ablations equal ours on that graph (``scores.on_inputs("token")``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.circuits import read_mib, write_mib

pytestmark = [pytest.mark.reference,
              pytest.mark.skipif(not os.environ.get("RS_REF_PYTHON"), reason="RS_REF_PYTHON (scripts/test_references.sh) not set")]

ROOT = Path(__file__).resolve().parents[2]
N, B, P = 8, 4, 6  # examples, MIB's batch size, positions


def _model(which: str):
    kw = dict(n_heads=4, d_head=8, d_model=32, seed=7, positional_embedding_type="standard")
    kw |= dict(attn_only=False, d_mlp=64, act_fn="gelu")  # EAP-IG's Graph always has MLP nodes: no attention-only model
    if which == "gqa":
        kw |= dict(n_key_value_heads=2)
    return ri.as_dtype(ri.models.make_attn_only(2, normalization_type="LN", **kw), torch.float64)


def _data(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    clean, corrupted = (torch.randint(0, model.cfg.d_vocab, (N, P), generator=g) for _ in range(2))
    labels = torch.stack([torch.randint(0, model.cfg.d_vocab, (N,), generator=g) for _ in range(2)], 1)
    return clean, corrupted, labels


def _metric(labels):
    def metric(logits):
        last = logits[:, -1]
        return (last.gather(1, labels[:, :1]) - last.gather(1, labels[:, 1:])).mean()  # MIB's logit_diff, mean

    return metric


def _reference(tmp: Path, model, data, jobs) -> dict:
    cfg = {k: v for k, v in _backend.config_of(model).items() if v is not None}
    cfg["dtype"] = str(cfg["dtype"]).replace("torch.", "")
    torch.save({"cfg": cfg, "state": _backend.portable_state(model)}, tmp / "model.pt")
    clean, corrupted, labels = data
    torch.save({"clean": clean, "corrupted": corrupted, "labels": labels}, tmp / "data.pt")
    request = {"model": str(tmp / "model.pt"), "data": str(tmp / "data.pt"), "batch_size": B, "jobs": jobs}
    (tmp / "request.json").write_text(json.dumps(request))
    env = {**os.environ, "PYTHONPATH": os.environ.get("RS_REF_PATH", "")}
    run = subprocess.run([os.environ["RS_REF_PYTHON"], str(ROOT / "scripts" / "reference_mib.py"), str(tmp / "request.json")],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_mib_attribution_writes_our_convention(tmp_path):
    model = _model("mlp")
    data = _data(model)
    clean, corrupted, labels = data
    eap = ri.edge_attribution_patching(model, clean, _metric(labels), reference=corrupted, progress=False)
    ours = read_mib(write_mib(tmp_path / "ours.json", model, scores=eap, batch_size=B), model)
    out = _reference(tmp_path, model, data, [{"kind": "attribute", "key": "eap", "out": str(tmp_path / "theirs.json")}])
    theirs = read_mib(out["eap"], model)
    assert theirs.convention == {}  # MIB's own file: no record
    diff = (ours.scores.effect - theirs.scores.effect).abs().nan_to_num(0).max().item()
    scale = ours.scores.effect.abs().nan_to_num(0).max().item()
    print(f"MIB's EAP vs write_mib: max |diff| {diff:.3g} (scores up to {scale:.3g})")
    # EAP-IG's Graph holds its scores in float32 (Graph.from_model): equal to that rounding
    assert torch.allclose(theirs.scores.effect.nan_to_num(0), ours.scores.effect.nan_to_num(0), rtol=2 ** -23, atol=1e-15)


@pytest.mark.parametrize("which", ["mlp", "gqa"])
def test_mib_evaluation_of_our_file_is_our_curve(tmp_path, which):
    """MIB's evaluate_area_under_curve on write_mib's file: our faithfulness at every point, CPR and CMD (to 1e-6),
    the edge counts. A GQA model is scored and evaluated on ungroup_gqa's copy, as MIB does."""
    model = _model(which)
    data = _data(model, seed=1)
    clean, corrupted, labels = data
    ours_model = ri.circuits.ungroup_gqa(model) if which == "gqa" else model
    eap = ri.edge_attribution_patching(ours_model, clean, _metric(labels), reference=corrupted, progress=False)
    path = write_mib(tmp_path / "importances.json", ours_model, scores=eap, batch_size=B)
    mib = ri.mib_scores(ours_model, clean, _metric(labels), eap, reference=corrupted, higher_is_better=True, progress=False)
    jobs = [{"kind": "curve", "key": "signed", "graph": str(path), "absolute": False},
            {"kind": "curve", "key": "absolute", "graph": str(path), "absolute": True}]
    if which == "gqa":
        jobs.append({"kind": "attribute", "key": "eap", "out": str(tmp_path / "theirs.json")})
    out = _reference(tmp_path, model, data, jobs)
    for ranking, curve in (("signed", mib.signed), ("absolute", mib.absolute)):
        theirs = out[ranking]
        gap = max(abs(a - b) for a, b in zip(curve.faithfulness, theirs["faithfulness"]))
        print(f"{which} {ranking}: faithfulness max |ours - MIB's| {gap:.3g}; counts {curve.mib_counts} vs {theirs['weighted_edge_counts']}")
        assert curve.faithfulness == pytest.approx(theirs["faithfulness"], abs=1e-6)
        assert list(curve.mib_counts) == theirs["weighted_edge_counts"]
    print(f"{which}: CPR {mib.cpr!r} vs {out['signed']['area_under']!r}, CMD {mib.cmd!r} vs {out['absolute']['area_from_1']!r}")
    assert mib.cpr == pytest.approx(out["signed"]["area_under"], abs=1e-6)
    assert mib.cmd == pytest.approx(out["absolute"]["area_from_1"], abs=1e-6)
    if which == "gqa":  # the budget keeps part of a KV group somewhere (copies of one k/v input, some in, some out)
        from rs_interp.circuits.selection import circuit_at

        keep, L = circuit_at(eap, 0.5, ranking="absolute"), eap.layout
        pairs = [(L.receivers.index(f"L{l}H{2 * g}.{x}"), L.receivers.index(f"L{l}H{2 * g + 1}.{x}"))
                 for l in range(2) for g in range(2) for x in "kv"]
        assert any(bool(keep[i, a]) != bool(keep[i, b]) for i in range(len(L.senders)) for a, b in pairs)
    if which == "gqa":  # MIB's own scores of the GQA model are the copies' EAP, and its file reads onto the copy
        theirs = read_mib(out["eap"], ours_model)
        with pytest.raises(ValueError, match="ungroup_gqa"):
            read_mib(out["eap"], model)
        ours = ri.circuits.mib_importances(eap, batch_size=B)
        assert torch.allclose(theirs.scores.effect.nan_to_num(0), ours.effect.nan_to_num(0), rtol=2 ** -23, atol=1e-15)


@pytest.mark.parametrize("method", ["zero", "position_mean"])
def test_mib_curves_under_ablation_are_ours_on_the_token_input(tmp_path, method):
    """MIB's evaluate_area_under_curve with zero or mean-positional ablation on write_mib's file: our curve of the same
    scores on EAP-IG's graph (EdgeEffects.on_inputs("token"), the token embedding alone as input), point by point."""
    model = _model("mlp")
    data = _data(model, seed=3)
    clean, corrupted, labels = data
    eap = ri.edge_attribution_patching(model, clean, _metric(labels), reference=corrupted, progress=False)
    path = write_mib(tmp_path / "importances.json", model, scores=eap, batch_size=B)
    curve = ri.faithfulness_curve(model, clean, _metric(labels), eap.on_inputs("token"), reference=corrupted, ablation=method,
                                  ranking="absolute", progress=False)
    intervention = {"zero": "zero", "position_mean": "mean-positional"}[method]
    out = _reference(tmp_path, model, data, [{"kind": "curve", "key": "c", "graph": str(path), "absolute": True,
                                              "intervention": intervention}])
    gap = max(abs(a - b) for a, b in zip(curve.faithfulness, out["c"]["faithfulness"]))
    print(f"{method}: faithfulness max |ours - MIB's| {gap:.3g}, CMD {curve.cmd!r} vs {out['c']['area_from_1']!r}")
    assert curve.faithfulness == pytest.approx(out["c"]["faithfulness"], abs=1e-6)
    assert list(curve.mib_counts) == out["c"]["weighted_edge_counts"]


@pytest.mark.parametrize("method", ["zero", "position_mean"])
def test_evaluate_graph_ablations_are_ours_with_the_token_embedding_input(tmp_path, method):
    model = _model("mlp")
    data = _data(model, seed=2)
    clean, corrupted, labels = data
    layout = ri.edge_layout(model, embedding="token")
    eap = ri.edge_attribution_patching(model, clean, _metric(labels), reference=corrupted, progress=False)
    circuit = [e for e in ri.top_edges(eap, 20, pruned=True)]
    token_circuit = [("tok_embed" if s == "embed" else s, r) for s, r in circuit]
    path = write_mib(tmp_path / "circuit.json", model, circuit=circuit)
    ours = ri.evaluate_circuit(model, clean, _metric(labels), token_circuit, reference=corrupted, ablation=method, embedding="token")
    summed = ri.evaluate_circuit(model, clean, _metric(labels), circuit, reference=corrupted, ablation=method)
    intervention = {"zero": "zero", "position_mean": "mean-positional"}[method]
    out = _reference(tmp_path, model, data, [{"kind": "evaluate", "key": "c", "graph": str(path), "intervention": intervention}])
    print(f"{method}: ours (token input) {ours!r}, EAP-IG's evaluate_graph {out['c']['mean']!r}, ours (summed input) {summed!r}")
    assert len(layout.senders) == len(ri.edge_layout(model).senders)
    assert ours == pytest.approx(out["c"]["mean"], abs=1e-6)
    if method == "zero":  # the summed input zeroes the positions too: another number (the 0.532 vs 0.703)
        assert abs(summed - ours) > 1e-6


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-m", "reference", "-s"]))
