"""Ground truth (issue 31): the AUROC against a pairwise count, which known edges carry effect
against the exact path patch, the compiled programs' metric, the induction circuit's derivation,
and the same numbers under both TransformerLens versions.

The section itself runs once, in tests/reproduce/test_report.py's report; these tests call the library.
"""

from __future__ import annotations

import random

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits import ground_truth as gt
from rs_interp.circuits import induction_truth as it
from rs_interp.circuits import tracr as rt
from rs_interp.circuits import tracr_truth as tt
from rs_interp.circuits.graph import edge_layout
from rs_interp.circuits.methods import IG_STEPS
from rs_interp.models.data import InductionBatch, induction_batch
from rs_interp.models.registry import held_out_batch
from rs_interp.reproduce.expected import INDUCTION_HEAD, NECESSARY_EDGE, PREV_TOKEN_HEAD
from rs_interp.reproduce.sections.faithfulness import N_PAIRS
from rs_interp.reproduce.sections.ground_truth import TRACR_PAIRS
from tests.builders import other_version_record

THRESHOLDS = dict(prev_token_head=PREV_TOKEN_HEAD, induction_head=INDUCTION_HEAD, necessary=NECESSARY_EDGE)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one intra-op thread (see tests/circuits/test_tracr.py), restored afterwards."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def pairwise_auroc(scores, labels):
    """Every (positive, negative) pair: 1 if the positive scores higher, 1/2 if tied."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg) / (len(pos) * len(neg))


# --- AUROC ------------------------------------------------------------------------------------------

def test_auroc_is_the_pairwise_count():
    rng = random.Random(31)
    for trial in range(300):
        n = rng.randint(2, 40)
        labels = [rng.random() < 0.3 for _ in range(n)]
        if all(labels) or not any(labels):
            labels[0] = not labels[0]
        # few distinct values, so ties within and across the classes are common
        scores = [rng.choice([0.0, 0.5, 1.0, 2.0, -1.0]) if trial % 2 else rng.gauss(0, 1) for _ in range(n)]
        assert gt.auroc(scores, labels) == pytest.approx(pairwise_auroc(scores, labels), abs=1e-12)
    assert gt.auroc([1.0, 1.0, 1.0], [True, False, False]) == 0.5
    assert gt.auroc([1.0, 2.0], [False, False]) is None
    with pytest.raises(ValueError, match="labels"):
        gt.auroc([1.0], [True, False])
    with pytest.raises(ValueError, match="NaN"):  # its AUROC would depend on the scores' order
        gt.auroc([float("nan"), 1.0, 0.5], [True, False, True])


def test_magnitudes_floor_is_relative():
    assert gt.magnitudes([-4.0, 4.0 * gt.NOISE_FLOOR, 8.0 * gt.NOISE_FLOOR, 0.0]) == [4.0, 0.0, 8.0 * gt.NOISE_FLOOR, 0.0]
    assert gt.magnitudes([1e-30, -2e-30]) == [1e-30, 2e-30]  # only relative: small scales stay
    with pytest.raises(ValueError, match="NaN"):
        gt.magnitudes([float("nan")])


# --- the compiled programs --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tracr_scored():
    """The section's runs: every compiled program's case and its methods' scores."""
    out = {}
    for name in rt.TRACR_PROGRAMS:
        case = tt.tracr_case(name, n_pairs=TRACR_PAIRS, seed=0)
        out[name] = (case, gt.score_methods(case))
    return out


@pytest.mark.parametrize("name", rt.TRACR_PROGRAMS)
def test_a_known_edge_carries_effect_iff_its_exact_patch_moves_the_metric(tracr_scored, name):
    """The classes come from the residual labels and the receiver's own output; the exact path
    patch measures the metric: they agree edge by edge, and every edge outside the known circuit
    moves nothing. So the exact scan separates the effective edges perfectly."""
    case, scores = tracr_scored[name]
    exact = scores["exact path patching"]
    assert case.effective <= case.known and set(case.inert) == case.known - case.effective
    for item, value, known in zip(exact.items, exact.scores, exact.known):
        edge = tuple(item.split(" -> "))
        if edge in case.effective:
            assert abs(value) > 1e-6, (item, value)
        else:
            assert value == 0.0, (item, value)
    assert exact.auroc_effective == 1.0
    K, c = len(case.known), len(case.effective)
    assert exact.auroc == pytest.approx((1 + c / K) / 2, abs=1e-12)


def test_inert_edges_say_why(tracr_scored):
    """reverse's length and opp_idx are the same in any two inputs of one length; its length head
    reads the tokens through an always-true selector, so those edges differ yet move nothing."""
    case, _ = tracr_scored["tracr-reverse"]
    assert case.effective == {("embed", "L3H0.v"), ("L3H0", "logits")}
    assert "the same in both runs" in case.inert[("MLP0", "MLP1")] and "length" in case.inert[("MLP0", "MLP1")]
    assert "does not depend on the difference" in case.inert[("embed", "L0H0.k")]


def test_receiver_response_is_local(tracr_scored):
    """A patch into the value of frac_prevs's aggregate moves that head's output; one into its query
    (positions only) moves nothing, and an edge outside the layout is refused."""
    case, _ = tracr_scored["tracr-frac_prevs"]
    moved = gt.receiver_response(case.model, case.tokens, case.reference, [("MLP0", "L1H0.v"), ("embed", "L1H0.q")])
    assert moved[("MLP0", "L1H0.v")] > 0.01 and moved[("embed", "L1H0.q")] == 0.0
    with pytest.raises(ValueError, match="not an edge"):
        gt.receiver_response(case.model, case.tokens, case.reference, [("L1H0", "L0H0.q")])


def test_node_scores_are_scored_over_heads(tracr_scored):
    case, scores = tracr_scored["tracr-sort"]
    scan = scores["ablation scan (heads)"]
    assert scan.items == ("L0H0", "L1H0", "L2H0") and scan.known == (False, True, True)
    assert scores["attribution patching (heads)"].auroc is not None
    assert scores["ablation scan (heads)"].auroc == pytest.approx(pairwise_auroc(gt.magnitudes(scan.scores), scan.known))
    case, scores = tracr_scored["tracr-hist"]
    assert scores["ablation scan (heads)"].auroc is None  # one head, in the circuit


def test_the_metric_is_the_programs_output(tracr_scored):
    """Categorical: the log-probability of the plain-Python program's output, summed over the
    output positions; numerical: the outputs themselves."""
    for name in ("tracr-sort", "tracr-frac_prevs"):
        case, _ = tracr_scored[name]
        meta = rt.metadata(name)
        inputs = [[meta.token_ids[int(t)] for t in row[1:]] for row in case.tokens]
        with torch.no_grad():
            logits = case.model(case.tokens).double()
        total = 0.0
        for b, x in enumerate(inputs):
            for i, y in enumerate(rt.reference(name, x)):
                if meta.output == "categorical":
                    total += float(torch.log_softmax(logits[b, i + 1], -1)[meta.output_values.index(y)])
                else:
                    total += float(logits[b, i + 1, 0])
        assert float(case.metric(logits)) == pytest.approx(total / len(inputs), rel=1e-12)


def test_missed_names_what_a_gradient_cannot_see(tracr_scored):
    """sort's EAP has no gradient through the categorical MLP and the attention scores; EAP-IG,
    averaging along the line from the reference, finds them all."""
    case, scores = tracr_scored["tracr-sort"]
    miss = gt.missed(scores["EAP"], scores["exact path patching"])
    assert {m["item"] for m in miss if m["how"] == "outranked"} == {"embed -> MLP0", "MLP0 -> L1H0.q", "MLP0 -> L1H0.k", "L1H0 -> MLP1"}
    assert [m["item"] for m in miss if m["how"] == "faint"] == ["MLP1 -> L2H0.k"]
    assert gt.missed(scores[f"EAP-IG (m = {IG_STEPS})"], scores["exact path patching"]) == []


def test_the_figure_draws_each_auroc():
    from rs_interp.ui.plots import ground_truth_figure

    fig = ground_truth_figure({"a": {"EAP": (0.5, 1.0), "scan": (None, None)}, "b": {"EAP": (0.25, 0.75), "scan": (1.0, 1.0)}})
    bars = {(t.name, t.xaxis): list(t.y) for t in fig.data}
    assert bars[("EAP", "x")] == [0.5, 0.25] and bars[("EAP", "x2")] == [1.0, 0.75]
    assert bars[("scan", "x")] == [None, 1.0]  # undefined: no bar
    with pytest.raises(ValueError, match="empty"):
        ground_truth_figure({})


# --- induction-2l -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def induction():
    model, batch = ri.load_toy_model("induction-2l"), held_out_batch()
    case, truth = it.induction_case(model, batch, n_pairs=N_PAIRS, reference=induction_batch(N_PAIRS, seed=13).tokens, **THRESHOLDS)
    return model, batch, case, truth


def test_the_induction_circuit_is_the_theorys(induction):
    model, batch, case, truth = induction
    _, ph = ri.find_prev_token_head(model, batch.tokens)
    p = f"L0H{ph}"
    assert truth.prev_token_heads == (p,) and truth.induction_heads == ("L1H0", "L1H1")
    assert {(p, "L1H0.k"), (p, "L1H1.k"), ("embed", f"{p}.v")} <= truth.edges
    assert all(("embed", f"L1H{h}.{x}") in truth.edges and (f"L1H{h}", "logits") in truth.edges for h in (0, 1) for x in "qv")
    assert case.known == case.effective == truth.edges and set(truth.evidence) == truth.edges


def test_the_evidence_is_what_the_ablations_measure(induction):
    """The derivation's numbers, recomputed through another path (GroundTruthCase and
    evaluate_circuit on the float32 model): the circuit's faithfulness, one edge's leave-one-out
    loss, and the best edge's gain; each kept edge passes the threshold, no added edge would."""
    model, _, case, truth = induction
    f32 = gt.GroundTruthCase("f32", model, case.tokens, case.reference, case.metric, case.known, case.effective, {}, "")
    assert gt.faithfulness(f32, truth.edges) == pytest.approx(truth.faithfulness, abs=1e-9)
    edge = ("L0H0", "L1H1.k") if ("L0H0", "L1H1.k") in truth.edges else sorted(truth.edges)[0]
    assert truth.faithfulness - gt.faithfulness(f32, truth.edges - {edge}) == pytest.approx(truth.leave_one_out[edge], abs=1e-9)
    best, gain = truth.best_edge
    assert gt.faithfulness(f32, truth.edges | {best}) - truth.faithfulness == pytest.approx(gain, abs=1e-9)
    assert min(truth.leave_one_out.values()) >= NECESSARY_EDGE > gain


def test_the_derivation_follows_the_evidence(induction):
    """A stricter threshold drops the weakest edge (and every edge left passes it); an untrained
    model has no previous-token head, and the derivation says so instead of asserting a circuit."""
    model, batch, case, truth = induction
    few = InductionBatch(batch.tokens[:200], batch.periods[:200], batch.scored[:200])  # the head scores need fewer
    pairs = dict(tokens=case.tokens, reference=case.reference, metric=case.metric)
    loose = truth
    weakest, second = sorted(loose.leave_one_out.values())[:2]
    cut = (weakest + second) / 2  # the weakest edge goes (and whatever then stops mattering)
    strict = it.induction_ground_truth(model, few, **pairs, prev_token_head=PREV_TOKEN_HEAD, induction_head=INDUCTION_HEAD,
                                       necessary=cut)
    assert min(loose.leave_one_out, key=loose.leave_one_out.get) in strict.dropped
    assert strict.edges == loose.edges - set(strict.dropped)
    assert all(v >= cut for v in strict.leave_one_out.values())
    with pytest.raises(ValueError, match="no previous-token head"):
        it.induction_ground_truth(ri.models.make_attn_only(2, seed=3), few, **pairs, **THRESHOLDS)
    with pytest.raises(ValueError, match="two-layer attention-only"):
        it.induction_ground_truth(ri.load_toy_model("induction-1l"), few, **pairs, **THRESHOLDS)


# --- both versions ----------------------------------------------------------------------------------

@pytest.mark.cross_version
def test_numbers_match_the_other_version(tracr_scored, induction):
    """Every score and AUROC of the section's runs, and the induction circuit's evidence, in float64:
    the same under TransformerLens 3.x and 4.x (1e-9; the derivation's float32 runs 1e-5)."""
    _, _, case, truth = induction
    runs = dict(tracr_scored) | {"induction-2l": (case, gt.score_methods(case))}
    mine = {}
    for name, (c, scores) in runs.items():
        mine[f"{name} effective"] = torch.tensor([e in c.effective for e in edge_layout(c.model).edges()])
        for method, s in scores.items():
            mine[f"{name} {method}"] = torch.tensor(s.scores, dtype=torch.float64)
            mine[f"{name} {method} auroc"] = torch.tensor([float("nan") if a is None else a for a in (s.auroc, s.auroc_effective)],
                                                          dtype=torch.float64)
    mine["induction circuit"] = torch.tensor([e in truth.edges for e in edge_layout(case.model).edges()])
    mine["induction evidence f32"] = torch.tensor([truth.faithfulness, *truth.leave_one_out.values(), truth.best_edge[1]])
    theirs = other_version_record("ground_truth", mine)
    assert mine.keys() == theirs.keys()
    for k in mine:
        a, b = mine[k], theirs[k]
        assert a.shape == b.shape and a.dtype == b.dtype, k
        if a.dtype == torch.bool:
            assert torch.equal(a, b), k
            continue
        tol = 1e-5 if k.endswith("f32") else 1e-9
        assert torch.equal(a.isnan(), b.isnan()), k
        ok = ~a.isnan()
        gap = float((a[ok] - b[ok]).abs().max()) if ok.any() else 0.0
        assert gap <= tol, f"{k}: 3.x and 4.x differ by {gap:.3g} (tolerance {tol:g})"


# --- the registry -----------------------------------------------------------------------------------

def test_a_registered_method_is_in_the_ground_truth_table_with_no_other_edit():
    """Issue 41: a new method is one ``Method`` in the registry; the section's rows, results and
    figure show it. A constant score ties every item, so its AUROC is exactly 1/2 on every model."""
    import dataclasses

    from rs_interp.circuits import methods as cm
    from rs_interp.reproduce.context import Context
    from rs_interp.reproduce.sections.ground_truth import ground_truth_section

    def constant(model, tokens, metric, *, reference, progress=False):
        exact = ri.path_patching(model, tokens, metric, reference=reference)
        return dataclasses.replace(exact, effect=torch.where(exact.layout.exists, 1.0, float("nan")).double())

    saved = dict(cm.METHODS)
    try:  # the exact methods the section measures against, and the new one: the rest would only cost time
        cm.METHODS.clear()
        cm.METHODS.update({n: m for n, m in saved.items() if m.key in ("EAP", "exact", "scan")})
        with cm.registered(cm.Method("constant (a test's method)", "constant", "edge", constant)):
            section = ground_truth_section(Context(progress=False))
    finally:
        cm.METHODS.clear()
        cm.METHODS.update(saved)
    models = [k for k in section.results if k not in ("ig_steps", "goal")]
    rows = [r for r in section.rows if "constant (a test's method)" in r.label]
    assert len(models) == len(rt.TRACR_PROGRAMS) + 1 and len(rows) == len(models)
    assert all(r.value == 0.5 and r.ok is None for r in rows)  # reported, not judged: no expected values
    assert all(section.results[m]["auroc"]["constant (a test's method)"]["known"] == 0.5 for m in models)
    assert any("constant" in (trace.name or "") for trace in section.figures[0].data)
