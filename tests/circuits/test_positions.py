"""Issue 66, position-aware edges (rs_interp.circuits.positions): exact path patching per span against a hooked run
written here, positional circuits (every edge: the clean run; none: the reference; one positional edge cut: its
patch), the positional pruning's rules, the faithfulness curve and the schema's checks."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits.positions import PositionSchema, positional_mask, positional_prune
from tests.builders import architecture_params, patching_metric, random_pair, variant_id
from tests.finite_differences import write

metric = patching_metric

SCHEMA = PositionSchema(("start", "middle", "end"), torch.tensor([[0, 0, 1, 1, 1, 1, 2, 2], [0, 1, 1, 1, 2, 2, 2, 2]]))


def _hooked_patch(model, toks, ref, sender, receiver, span):
    """The metric with ``sender``'s write change added to ``receiver``'s input at ``span``'s positions only: a head's
    input by recomputing its q/k/v from the moved stream (the norm by the model's own module), written apart."""
    _, clean = model.run_with_cache(toks)
    _, refc = model.run_with_cache(ref)
    w = write(model, clean, refc, sender, toks, ref) * (SCHEMA.span_of == SCHEMA.index(span))[..., None]
    L = model.cfg.n_layers
    if receiver == "logits":
        hooks = [(f"blocks.{L - 1}.hook_resid_post", lambda t, hook: t + w)]
    elif receiver.startswith("MLP"):
        hooks = [(f"blocks.{int(receiver[3:])}.hook_mlp_in", lambda t, hook: t + w)]
    else:
        head, kind = receiver.split(".")
        l, h = (int(x) for x in head[1:].split("H"))
        attn, ln1 = model.blocks[l].attn, model.blocks[l].ln1

        def moved(t, hook):
            t = t.clone()
            x = clean[f"blocks.{l}.hook_resid_pre"] + w
            t[:, :, h] = ln1(x) @ getattr(attn, f"W_{kind.upper()}")[h] + getattr(attn, f"b_{kind.upper()}")[h]
            return t
        hooks = [(f"blocks.{l}.attn.hook_{kind}", moved)]
    model.cfg.use_hook_mlp_in = True
    try:
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=hooks))) - float(metric(model(toks)))
    finally:
        model.cfg.use_hook_mlp_in = False


EDGES = [("embed", "L1H0.k", "start"), ("L0H1", "L2H0.v", "middle"), ("L1H1", "logits", "end"), ("MLP0", "L1H0.q", "end"),
         ("embed", "MLP1", "middle")]


@pytest.mark.parametrize("variant", [("LN", "standard", False), *architecture_params([("RMS", "rotary", False, "gqa")])],
                         ids=variant_id)
def test_path_patching_per_span_is_the_hooked_patch_and_a_positional_cut_is_it_too(variant):
    model, toks, ref = random_pair(variant)
    grouped = len(variant) == 4
    edges = [e for e in EDGES if not (grouped and e[1].endswith((".k", ".v")))]
    pp = ri.path_patching(model, toks, metric, reference=ref, spans=SCHEMA, edges=[e[:2] for e in edges], progress=False)
    pos = pp.positional()
    every = [(s, r, u) for (s, r) in pp.layout.edges() for u in SCHEMA.names]
    for e in edges:
        want = _hooked_patch(model, toks, ref, *e)
        assert pos.edge(*e) == pytest.approx(want, abs=1e-9, rel=1e-9), e
        cut = ri.evaluate_circuit(model, toks, metric, [x for x in every if x != e], reference=ref, spans=SCHEMA)
        assert cut - pp.clean == pytest.approx(want, abs=1e-9, rel=1e-9), e
    with torch.no_grad():
        clean, reference = float(metric(model(toks))), float(metric(model(ref)))
    assert ri.evaluate_circuit(model, toks, metric, every, reference=ref, spans=SCHEMA) == pytest.approx(clean, abs=1e-9)
    with pytest.warns(UserWarning, match="no path"):
        assert ri.evaluate_circuit(model, toks, metric, every[:1], reference=ref, spans=SCHEMA) == pytest.approx(reference, abs=1e-9)


def test_the_positional_curve_runs_every_positional_edge_at_1_and_is_the_position_free_curve_with_one_span():
    """At fraction 1 the positional circuit is the clean run; with one span covering every position the positional
    curve is the position-free one (the same circuits, the same passes)."""
    model, toks, ref = random_pair(("LN", "standard", False))
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, spans=SCHEMA)
    curve = ri.faithfulness_curve(model, toks, metric, eap.positional(), reference=ref, fractions=(0.1, 0.5, 1.0), progress=False)
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-9)
    one = PositionSchema(("all",), torch.zeros_like(toks))
    single = ri.edge_attribution_patching(model, toks, metric, reference=ref, spans=one)
    a = ri.mib_scores(model, toks, metric, single.positional(), reference=ref, progress=False)
    b = ri.mib_scores(model, toks, metric, single, reference=ref, progress=False)
    assert a.cpr == pytest.approx(b.cpr, abs=1e-12) and a.cmd == pytest.approx(b.cmd, abs=1e-12)
    assert a.absolute.n_edges == b.absolute.n_edges


def test_positional_pruning_keeps_what_reaches_the_logits_through_its_positions():
    """A head at span u is fed by its key or value at u or before, never after; an MLP by its input at its own span."""
    model, _, _ = random_pair(("LN", "standard", False))
    layout = ri.edge_layout(model)
    names = SCHEMA.names
    keep = positional_mask(layout, names, [("embed", "L0H0.v", "start"), ("L0H0", "logits", "end")])
    assert int(positional_prune(layout, keep).sum()) == 2  # the value read at 'start' feeds the head at 'end'
    late = positional_mask(layout, names, [("embed", "L0H0.v", "end"), ("L0H0", "logits", "start")])
    assert int(positional_prune(layout, late).sum()) == 0  # a value read at 'end' never reaches the head at 'start'
    mlp = positional_mask(layout, names, [("embed", "MLP0", "start"), ("MLP0", "logits", "end")])
    assert int(positional_prune(layout, mlp).sum()) == 0  # an MLP works position by position
    query = positional_mask(layout, names, [("embed", "L1H0.q", "middle"), ("L1H0", "logits", "middle")])
    assert int(positional_prune(layout, query).sum()) == 2


def test_schemas_are_checked():
    with pytest.raises(ValueError, match="in order"):
        PositionSchema(("a", "b"), torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="exactly one span"):
        PositionSchema(("a", "b"), torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="distinct"):
        PositionSchema(("a", "a"), torch.tensor([[0, 1]]))
    assert PositionSchema.from_starts(("a", "b"), [[0, 3]], 5).span_of.tolist() == [[0, 0, 0, 1, 1]]
    model, toks, ref = random_pair(("LN", "standard", False))
    with pytest.raises(ValueError, match="span_of has shape"):
        ri.edge_attribution_patching(model, toks, metric, reference=ref, spans=PositionSchema.each(toks[:, :4]))
    with pytest.raises(ValueError, match="GradDrop"):
        ri.edge_attribution_patching(model, toks, metric, reference=ref, spans="each", grad_drop=True)
