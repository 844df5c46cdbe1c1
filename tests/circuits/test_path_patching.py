"""Issue 30 item 3: exact path patching equals one hand-written hooked run per edge."""

import pytest
import torch

import rs_interp as ri
from tests.builders import (
    ARCHITECTURES,
    architecture_params,
    needs_tl3,
    patching_metric,
    random_pair,
    sender_write_change,
    variant_id,
)
from tests.builders import ln1_by_hand as _norm

metric = patching_metric


_setup = random_pair





def _patched(model, toks, receiver, w):
    """metric of one full forward pass with ``w`` added to the receiver's input alone."""
    L = model.cfg.n_layers
    if receiver == "logits":
        hooks = [(f"blocks.{L - 1}.hook_resid_post", lambda t, hook: t + w)]
    elif receiver.startswith("MLP"):
        model.cfg.use_hook_mlp_in = True
        hooks = [(f"blocks.{int(receiver[3:])}.hook_mlp_in", lambda t, hook: t + w)]
    else:  # a head's q/k/v: recompute its projection from (its layer's input + w), before rotary
        head, kind = receiver.split(".")
        l, h = (int(x) for x in head[1:].split("H"))
        attn, box = model.blocks[l].attn, {}
        W, b = getattr(attn, f"W_{kind.upper()}")[h], getattr(attn, f"b_{kind.upper()}")[h]
        shortformer = model.cfg.positional_embedding_type == "shortformer"

        def project(t, hook):
            t = t.clone()
            x = box["x"] + w + (box["pos"] if shortformer and kind in "qk" else 0)
            t[:, :, h] = _norm(model, l, x) @ W + b
            return t
        hooks = [(f"blocks.{l}.hook_resid_pre", lambda t, hook: box.update(x=t)), (f"blocks.{l}.attn.hook_{kind}", project)]
        hooks += [("hook_pos_embed", lambda t, hook: box.update(pos=t))] if shortformer else []
    try:
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=hooks)))
    finally:
        model.cfg.use_hook_mlp_in = False


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", False), ("LN", "rotary", True),
            pytest.param((None, "shortformer", True), marks=needs_tl3)]


# (grouped-query receivers, L1KV0.k, are checked against the multi-head twin in tests/integration/test_architectures.py)
@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params([v for v in ARCHITECTURES if v[3] != "gqa"])], ids=variant_id)
def test_every_edge_equals_a_hand_written_run(variant):
    model, toks, ref = _setup(variant)
    pp = ri.path_patching(model, toks, metric, reference=ref)
    with torch.no_grad():
        clean = float(metric(model(toks)))
    assert pp.clean == pytest.approx(clean, abs=1e-12)
    assert torch.equal(pp.effect.isnan(), ~pp.layout.exists)
    writes = {s: sender_write_change(model, toks, ref, s) for s in pp.layout.senders}
    for s, r in pp.layout.edges():
        assert pp.edge(s, r) == pytest.approx(_patched(model, toks, r, writes[s]) - clean, abs=1e-9), (s, r)


def test_batched_passes_and_subsets_agree():
    """One edge per pass (memory_budget=1) or all of a receiver's in one; a chosen subset is computed
    alone (NaN elsewhere) with the same numbers."""
    model, toks, ref = _setup(("LN", "standard", False))
    full = ri.path_patching(model, toks, metric, reference=ref)
    one = ri.path_patching(model, toks, metric, reference=ref, memory_budget=1)
    assert (full.effect - one.effect).nan_to_num(0).abs().max() <= 1e-12
    chosen = [("L0H1", "L2H0.k"), ("embed", "logits"), ("MLP1", "MLP2")]
    part = ri.path_patching(model, toks, metric, reference=ref, edges=chosen)
    assert int((~part.effect.isnan()).sum()) == 3
    assert all(part.edge(s, r) == full.edge(s, r) for s, r in chosen)


@pytest.mark.parametrize("edges,message", [([("L2H0", "L1H0.q")], "not an edge"), ([("L9H0", "logits")], "not a sender"),
                                           ([], "empty"), (["embed"], "pairs")])
def test_bad_edges(edges, message):
    model, toks, ref = _setup(("LN", "standard", False))
    with pytest.raises(ValueError, match=message):
        ri.path_patching(model, toks, metric, reference=ref, edges=edges)

