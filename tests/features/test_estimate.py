"""rs_interp.features.estimate: the cost line a long graph writes before it runs."""

from __future__ import annotations

import torch

from rs_interp.features import attribution_graph
from rs_interp.features.estimate import matmul_rate
from tests.builders import make_variant
from tests.features.test_transcoders import random_transcoders


def test_measuring_the_rate_leaves_the_callers_random_state_alone():
    """matmul_rate draws its matrices from a generator of its own; attribution_graph, whose progress line
    (on by default) measures it, leaves torch's global random state as it found it, so a user's draws
    after a graph are the draws they would have had."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    assert matmul_rate(64, 1) > 0
    assert torch.equal(torch.get_rng_state(), before)
    model = make_variant("LN", "standard", False, seed=1)
    tcs = random_transcoders(model.cfg.n_layers, model.cfg.d_model, 16, activation="topk")
    before = torch.get_rng_state()
    attribution_graph(model, tcs, torch.arange(6), progress=True)
    assert torch.equal(torch.get_rng_state(), before)


def test_the_cost_line_goes_to_stderr_with_the_bars(monkeypatch, capsys):
    """The line a long graph writes before it runs (progress is on by default) goes where the bars go,
    stderr: a script's stdout (its own results, piped on) stays its own."""
    import rs_interp.features.estimate as estimate

    monkeypatch.setattr(estimate, "matmul_rate", lambda *args, **kwargs: 1e3)  # a slow machine: the estimate passes the 2 s line
    model = make_variant("LN", "standard", False, seed=1)
    tcs = random_transcoders(model.cfg.n_layers, model.cfg.d_model, 16, activation="topk")
    capsys.readouterr()
    attribution_graph(model, tcs, torch.arange(6))
    out, err = capsys.readouterr()
    assert out == "" and "attribution graph estimate" in err


def test_each_term_is_the_bytes_of_the_tensors_it_counts(monkeypatch):
    """The memory estimate is a sum of what the run allocates: on a small model (3 layers, 3 of them over 12
    positions, float64), the clean run's logits, patterns and streams, the active features, the logit rows and
    the largest batch of gradients the backward returns are, to the byte, the terms that count them (the feature
    rows are counted over the mean share ``(L - 1) / (2 L)`` of the active features: bounded by the rows over
    every earlier feature)."""
    import rs_interp.features.attribution as A
    from rs_interp.features.estimate import estimate_graph

    model = make_variant("LN", "standard", False, seed=1, n_layers=3, n_ctx=16)
    tcs = random_transcoders(model.cfg.n_layers, model.cfg.d_model, 16, activation="topk", k=3)
    seen: dict = {"grads": 0}
    clean_nodes, rows, grad = A._Attribution.clean_nodes, A._Attribution.rows, torch.autograd.grad

    def record_grads(*args, **kwargs):
        out = grad(*args, **kwargs)
        seen["grads"] = max(seen["grads"], sum(g.nbytes for g in out if g is not None))
        return out

    monkeypatch.setattr(A._Attribution, "clean_nodes", lambda self: seen.setdefault("nodes", clean_nodes(self)))
    monkeypatch.setattr(A._Attribution, "rows", lambda self, nodes: seen.setdefault("rows", rows(self, nodes)))
    monkeypatch.setattr(torch.autograd, "grad", record_grads)
    P, batch = 12, 4
    attribution_graph(model, tcs, torch.arange(P), max_feature_nodes=20, batch_size=batch, progress=False)
    nodes, computed = seen["nodes"], seen["rows"]
    e = estimate_graph(model, tcs, P, max_feature_nodes=20, batch_size=batch, max_logits=len(nodes.logit_tokens),
                       rate=1e10)
    c = nodes.clean
    assert e.n_active == len(nodes.features) == 3 * P * 3
    assert e.parts["rows: clean run: logits"] == c.logits.nbytes
    assert e.parts["rows: clean run: frozen patterns"] == sum(t.nbytes for n, t in c.frozen.items() if "pattern" in n)
    streams = sum(t.nbytes for t in (*c.inputs, *c.outputs, nodes.errors, c.embed))
    assert e.parts["rows: clean run: streams (transcoder inputs, MLP outputs, errors, embeddings)"] == streams
    active = nodes.features.nbytes + nodes.activations.nbytes
    assert e.parts["rows: clean run: active features (index triples, activations)"] == active
    assert e.parts["rows: logit rows"] == computed.logit_rows.nbytes
    assert e.parts["rows: a batch's gradients"] == seen["grads"]
    held = sum(a.nbytes + b.nbytes for _, a, b in computed.feature_rows.blocks)
    every_earlier = 20 * (e.n_active + 4 * P) * 8  # each row over every feature and the error and token columns
    assert 0 < e.parts["rows: feature rows"] <= every_earlier and held <= every_earlier


def test_the_heap_holes_are_counted_while_a_batch_is_under_the_mmap_ceiling():
    """glibc serves a block under 32 MiB from its heap, which keeps it once freed: the holes around the feature
    rows are counted while a batch's (batch, pos, d_model) tensor is under 32 MiB (GPT-2 small's shape, batches
    of 16: 256 tokens, 12.6 MB), as ``S (P d - share A - T) b``, and not once it is mmapped (1,024 tokens, 50 MB)."""
    from types import SimpleNamespace

    from rs_interp.features.estimate import estimate_graph

    cfg = SimpleNamespace(n_layers=12, d_model=768, n_heads=12, d_mlp=3072, d_vocab=50257, d_vocab_out=50257,
                          dtype=torch.float32)
    tcs = [SimpleNamespace(k=64, d_transcoder=24576)] * 12
    holes = "rows: heap holes around the feature rows (glibc)"
    e256, e1024 = (estimate_graph(cfg, tcs, P, max_feature_nodes=1024, batch_size=16, dense=False, rate=1e10)
                   for P in (256, 1024))
    A, T = 64 * 12 * 256, 13 * 256
    assert e256.parts[holes] == int(1024 * (256 * 768 - 11 / 24 * A - T) * 4)
    assert e1024.parts[holes] == 0 and e1024.parts["assembly: heap holes around the feature rows (glibc)"] == 0
    assert e256.peak_bytes == sum(v for k, v in e256.parts.items() if k.startswith("rows:"))
