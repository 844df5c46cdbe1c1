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
