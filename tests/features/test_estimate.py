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
