"""Issue 30 item 4: circuits and faithfulness curves, exact."""

import math

import pytest
import torch

import rs_interp as ri
from conftest import architecture_params, make_variant, variant_id


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 3].mean() + 0.1 * logits[:, 2, 5].sum()


def _setup(variant=("LN", "standard", False), seed=1):
    model = make_variant(*variant, seed=seed, n_layers=3, n_heads=2)
    g = torch.Generator().manual_seed(seed)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (3, 8), generator=g) for _ in range(2))
    return model, toks, ref


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", True), ("LNPre", "rotary", False)]


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_full_circuit_is_the_clean_run_and_empty_the_reference_run(variant):
    model, toks, ref = _setup(variant)
    edges = ri.edge_layout(model).edges()
    with torch.no_grad():
        clean, reference_run = float(metric(model(toks))), float(metric(model(ref)))
    assert ri.evaluate_circuit(model, toks, metric, edges, reference=ref) == pytest.approx(clean, abs=1e-9)
    assert ri.evaluate_circuit(model, toks, metric, [], reference=ref) == pytest.approx(reference_run, abs=1e-9)
    assert ri.evaluate_circuit(model, toks, metric, edges, reference=ref, method="mean") == pytest.approx(clean, abs=1e-9)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_cutting_one_edge_is_path_patching_that_edge(variant):
    """With every other edge kept, everything upstream of the receiver is the clean run's, so cutting
    (s, r) is exactly patching that one edge: clean + path_patching's effect (an independent brute
    force, tests/test_path_patching.py)."""
    model, toks, ref = _setup(variant)
    pp = ri.path_patching(model, toks, metric, reference=ref)
    edges = pp.layout.edges()
    for cut in edges[:: max(1, len(edges) // 12)]:
        kept = [e for e in edges if e != cut]
        got = ri.evaluate_circuit(model, toks, metric, kept, reference=ref)
        assert got == pytest.approx(pp.clean + pp.edge(*cut), abs=1e-9), cut


def test_mean_ablation_of_one_edge_by_hand():
    """Mean ablation: the cut edge carries the sender's mean write over the reference batch at each
    position; checked against one hooked run written here (the embedding into the logits)."""
    model, toks, ref = _setup()
    box = {}
    with torch.no_grad():
        model.run_with_hooks(ref, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: box.update(ref=t.clone()))])
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: box.update(run=t.clone()))])
        w = box["ref"].mean(0, keepdim=True) - box["run"]
        want = float(metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.2.hook_resid_post", lambda t, hook: t + w)])))
    edges = [e for e in ri.edge_layout(model).edges() if e != ("embed", "logits")]
    assert ri.evaluate_circuit(model, toks, metric, edges, reference=ref, method="mean") == pytest.approx(want, abs=1e-9)


def test_faithfulness_curve_and_its_areas():
    model, toks, ref = _setup()
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    curve = ri.faithfulness_curve(model, eap, toks, metric, reference=ref)
    total = eap.layout.n_edges
    assert curve.fractions == ri.circuits.MIB_FRACTIONS
    assert curve.n_edges == tuple(min(total, math.ceil(f * total)) for f in curve.fractions)
    for n, v in zip(curve.n_edges, curve.values):  # each point is evaluate_circuit on the top n edges by |estimate|
        flat = sorted(((abs(float(eap.effect[i, j])), i * 1000 + j, (s, r)) for i, s in enumerate(eap.layout.senders)
                       for j, r in enumerate(eap.layout.receivers) if eap.layout.exists[i, j]), key=lambda x: (-x[0], x[1]))
        top = [e for _, _, e in flat[:n]]
        assert v == pytest.approx(ri.evaluate_circuit(model, toks, metric, top, reference=ref), abs=1e-12)
    with torch.no_grad():
        full, empty = float(metric(model(toks))), float(metric(model(ref)))
    faith = torch.tensor([(v - empty) / (full - empty) for v in curve.values], dtype=torch.float64)
    x = torch.tensor(curve.fractions, dtype=torch.float64)
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-9)
    assert curve.cpr == pytest.approx(float(torch.trapezoid(faith, x)), abs=1e-12)
    assert curve.cmd == pytest.approx(float(torch.trapezoid((1 - faith).abs(), x)), abs=1e-12)


def test_top_edges_and_bad_input():
    model, toks, ref = _setup()
    pp = ri.path_patching(model, toks, metric, reference=ref)
    top3 = ri.top_edges(pp, 3)
    assert top3 == {tuple(label.split(" -> ")) for label, _ in pp.top(3)}
    with pytest.raises(ValueError, match="fractions"):
        ri.faithfulness_curve(model, pp, toks, metric, reference=ref, fractions=(0.5, 0.2))
    other = ri.path_patching(make_variant("LN", "standard", True, n_layers=2), toks, metric, reference=ref)
    with pytest.raises(ValueError, match="another model"):
        ri.faithfulness_curve(model, other, toks, metric, reference=ref)
    with pytest.raises(ValueError, match="not an edge"):
        ri.evaluate_circuit(model, toks, metric, [("L2H0", "L0H0.q")], reference=ref)
    with pytest.raises(ValueError, match="method"):
        ri.evaluate_circuit(model, toks, metric, [], reference=ref, method="zero")


def test_faithfulness_figure():
    from rs_interp import plots

    model, toks, ref = _setup()
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    curves = {"EAP": ri.faithfulness_curve(model, eap, toks, metric, reference=ref, fractions=(0.1, 0.5, 1.0))}
    fig = plots.faithfulness_figure(curves)
    (trace,) = fig.data
    assert list(trace.x) == [10.0, 50.0, 100.0] and list(trace.y) == list(curves["EAP"].faithfulness)
    assert f"CPR {curves['EAP'].cpr:.3f}" in trace.name
    with pytest.raises(ValueError, match="empty"):
        plots.faithfulness_figure({})
