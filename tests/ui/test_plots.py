"""Issue 42: every figure takes the result object the helper returned (and still its parts), and draws
what the result holds. Each function of ``rs_interp.ui.plots`` is called here with a result."""

from __future__ import annotations

import math

import pytest
import torch

import rs_interp as ri
from rs_interp.ui import plots


@pytest.fixture(scope="module")
def setup():
    model = ri.load_toy_model("induction-2l")
    a, b = ri.induction_batch(4, seed=0), ri.induction_batch(4, seed=1)
    return model, a, b, ri.next_token_loss(a.targets)


def _y(fig, i=0):
    return [float(v) for v in fig.data[i].y]


def _z(fig):
    return [list(r) for r in fig.data[0].z]


def test_head_figures_take_results(setup):
    model, a, b, metric = setup
    scan = ri.head_ablation_scan(model, a.tokens, metric, ablation="resample", reference=b.tokens)
    fig = plots.head_scan_figure(scan)
    assert _z(fig) == scan.effect.double().tolist() and "resample" in fig.layout.title.text
    ind = ri.induction_scores(model, a.tokens, periods=a.periods)
    assert _z(plots.head_scan_figure(ind)) == ind.induction.double().tolist()
    assert plots.head_scan_figure(scan.effect, title="t").layout.title.text == "t"  # the parts still work
    atp = ri.attribution_patching(model, a.tokens, metric, reference=b.tokens)
    fig = plots.estimate_vs_exact_figure(atp, scan)
    assert list(fig.data[1].x) == scan.effect.flatten().tolist() and list(fig.data[1].y) == atp.effect.flatten().tolist()
    assert list(fig.data[1].text) == list(scan.labels)
    pat = ri.attention_patterns(model, plots.period_sequence(11))[:, 0]
    assert len(plots.attention_figure(pat, [(0, 0), (1, 1)], period=11).data) >= 2
    assert "L0" in plots.composition_heatmaps(ri.composition_scores(model, "k")).layout.annotations[0].text or \
        len(plots.composition_heatmaps(ri.composition_scores(model, "k")).data) == 1


def test_edge_figures_take_results(setup):
    model, a, b, metric = setup
    eap = ri.edge_attribution_patching(model, a.tokens, metric, reference=b.tokens)
    exact = ri.path_patching(model, a.tokens, metric, reference=b.tokens)
    fig = plots.estimate_vs_exact_figure(eap, exact)
    assert len(fig.data[1].x) == eap.layout.n_edges
    mib = ri.mib_scores(model, a.tokens, metric, eap, reference=b.tokens, fractions=(0.2, 0.5, 1.0))
    fig = plots.faithfulness_figure(mib)
    assert [_y(fig, i) for i in range(2)] == [list(mib.signed.faithfulness), list(mib.absolute.faithfulness)]
    assert f"CPR {mib.cpr:.3f}" in fig.data[0].name and f"CMD {mib.cmd:.3f}" in fig.data[1].name
    assert _y(plots.faithfulness_figure(mib.absolute)) == list(mib.absolute.faithfulness)
    assert list(fig.layout.xaxis.ticktext)[:4] == ["0.1", "0.2", "0.5", "1"]  # one label a tick
    circuit = plots.circuit_figure(eap)
    assert circuit.data


def test_path_and_lens_figures_take_results(setup):
    model, a, b, _ = setup
    att = ri.path_logit_attribution(model, a.tokens, targets=a.targets)
    fig = plots.path_contributions_figure(att)
    assert list(fig.data[0].x) == list(att.labels) and _y(fig) == pytest.approx(att.centered.mean(-1).tolist())
    dla = ri.direct_logit_attribution(model, a.tokens, targets=a.targets)
    assert _y(plots.path_contributions_figure(dla)) == pytest.approx(dla.mean().tolist())
    so = ri.second_order_attribution(model, a.tokens, targets=a.targets, positions=[-2])
    assert _z(plots.second_order_figure(so)) == so.matrix(0, -1).double().tolist()
    lens = ri.logit_lens(model, a.tokens, targets=a.targets)
    fig = plots.logit_lens_figure(lens)
    want = [float(lens.target_probs[i].double().nanmean()) for i in range(len(lens.labels))]
    assert list(fig.data[0].x) == list(lens.labels) and _y(fig) == pytest.approx(want) and fig.layout.showlegend
    with pytest.raises(ValueError, match="targets"):
        plots.logit_lens_figure(ri.logit_lens(model, a.tokens))


def test_the_other_figures_take_results():
    from rs_interp.circuits import ground_truth as gt
    from rs_interp.circuits.tracr_truth import tracr_case
    from rs_interp.reproduce.geometry import collapse_cloud, collapse_run

    pc = ri.count_parameters(ri.models.gpt2_config("small"))
    assert sum(d.x[0] for d in plots.parameter_breakdown_figure(pc).data) == sum(pc.by_category.values())
    runs = [collapse_run(collapse_cloud(0), beta, skip=s) for beta in (1.0,) for s in (False, True)]
    assert len(plots.collapse_figure(runs).data) >= 2 and plots.layernorm_figure().data
    scores = {"tracr-hist": gt.score_methods(tracr_case("tracr-hist", n_pairs=4))}
    fig = plots.ground_truth_figure(scores)
    drawn = {(t.name, x, y) for t in fig.data for x, y in zip(t.x, t.y) if y is not None}
    assert all(("EAP", "tracr-hist", s.auroc) in drawn or math.isnan(s.auroc or math.nan)
               for m, s in scores["tracr-hist"].items() if m == "EAP")
    study = type("Result", (), {"seen": {"model": 0.9}, "unseen": {"model": 0.1}})()
    assert _y(plots.finance_figure(study), 1) == [0.1]
    assert plots.position_figure([0.5, 0.6], [0.9, 1.0], [0.1, 0.2, 0.1], head=(0, 0), drop=1).data


def test_the_jacobian_lens_figure_draws_the_readings_it_is_given(setup):
    model, a, _, _ = setup
    toks = a.tokens[:2]
    readings = ri.jacobian_lens(model, toks, ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False))
    fig = plots.jacobian_lens_figure(readings, compare=ri.logit_lens(model, toks), positions=[-2, -1])
    assert len(fig.data) == 2 and [len(d.x) for d in fig.data] == [2, 2]
    top = readings.top_probs[:, 0, -2:, 0]  # the colour: the top token's probability at each point and position
    assert torch.allclose(torch.as_tensor(fig.data[0].z, dtype=top.dtype), top, atol=1e-6)


def test_every_figure_is_covered():
    """A new figure function must be called above with a result object."""
    import inspect

    covered = set()
    for name, fn in dict(globals()).items():
        if name.startswith("test_") and name != "test_every_figure_is_covered":
            covered |= {f for f in plots.__all__ if f"plots.{f}(" in inspect.getsource(fn)}
    assert set(plots.__all__) - {"period_sequence"} <= covered | {"attention_figure"}, set(plots.__all__) - covered
    assert torch.is_tensor(plots.period_sequence(11))
