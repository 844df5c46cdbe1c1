"""Issue 44, ACDC: its two limits (threshold 0 keeps every edge with an effect, infinity none) and the
algorithm against a loop written here over rs_interp.evaluate_circuit."""

from __future__ import annotations

import warnings

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.circuits.acdc import acdc
from tests.builders import make_variant


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 3].mean() + 0.1 * logits[:, 2, 5].sum()


def _setup(seed=3, dead=None, attn_only=False):
    model = make_variant("LN", "standard", attn_only, seed=seed, n_layers=2, n_heads=2)
    if dead is not None:  # a head that writes nothing: W_O = 0
        state = _backend.portable_state(model)
        state[f"blocks.{dead[0]}.attn.W_O"][dead[1]] = 0.0
        _backend.load_portable_state(model, state)
    g = torch.Generator().manual_seed(seed)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (3, 8), generator=g) for _ in range(2))
    return model, toks, ref


def test_threshold_zero_keeps_every_edge_with_an_effect_and_infinity_none():
    """L0H1 writes nothing: its outgoing edges carry nothing and its incoming ones move a write that
    is multiplied by 0, so each of them changes the metric by exactly 0 in every graph: at threshold 0
    ACDC removes exactly those, and keeps every edge whose exact path patch is nonzero; at infinity
    it keeps none."""
    model, toks, ref = _setup(dead=(0, 1))
    run = acdc(model, toks, metric, reference=ref, threshold=0.0)
    pp = ri.path_patching(model, toks, metric, reference=ref)
    layout = run.layout
    dead = {e for e in layout.edges() if e[0] == "L0H1" or e[1].startswith("L0H1.")}
    assert set(run.circuit()) == set(layout.edges()) - dead
    effect = {e: pp.edge(*e) for e in layout.edges()}
    assert all(abs(effect[e]) <= 1e-12 for e in dead) and all(abs(effect[e]) > 1e-9 for e in run.circuit())
    assert all(run.edge(*e) == 0.0 for e in dead)
    empty = acdc(model, toks, metric, reference=ref, threshold=float("inf"))
    assert empty.circuit() == [] and not bool(empty.kept.any())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert empty.final == pytest.approx(ri.evaluate_circuit(model, toks, metric, [], reference=ref), abs=1e-12)


def _acdc_by_hand(model, toks, ref, threshold, method):
    """ACDC written out over the public evaluate_circuit: receivers from the logits back, each one's
    senders from the latest back; remove an edge iff the metric moves by at most the threshold."""
    layout = ri.edge_layout(model)
    edges = layout.edges()
    order = sorted(edges, key=lambda e: (-layout.receivers.index(e[1]), -layout.senders.index(e[0])))
    kept, changes = set(edges), {}
    run = lambda c: ri.evaluate_circuit(model, toks, metric, c, reference=ref, ablation=method)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        current = run(kept)
        for e in order:
            value = run(kept - {e})
            changes[e] = value - current
            if abs(value - current) <= threshold:
                kept.discard(e)
                current = value
    return kept, changes, current


@pytest.mark.parametrize("method,threshold", [("resample", 0.01), ("resample", 0.05), ("mean", 0.02)])
def test_acdc_is_the_loop_over_evaluate_circuit(method, threshold):
    model, toks, ref = _setup(seed=4)
    run = acdc(model, toks, metric, reference=ref, threshold=threshold, ablation=method)
    kept, changes, final = _acdc_by_hand(model, toks, ref, threshold, method)
    assert set(run.circuit()) == kept and 0 < len(kept) < run.layout.n_edges
    assert all(run.edge(*e) == pytest.approx(v, abs=1e-12) for e, v in changes.items())
    assert run.final == pytest.approx(final, abs=1e-12) and run.threshold == threshold and run.ablation == method


@pytest.mark.parametrize("threshold", [-1.0, float("nan"), "0.1", True])
def test_bad_thresholds_are_refused(threshold):
    model, toks, ref = _setup(attn_only=True)
    with pytest.raises(ValueError, match="threshold"):
        acdc(model, toks, metric, reference=ref, threshold=threshold)
