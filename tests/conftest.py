"""Shared, seeded models and batches. Session-scoped: helpers must never mutate them (issue 9
checks that), so sharing is safe and keeps the suite fast. Every model trained from a shipped recipe
(or the finance study's) goes through one session-wide :class:`~rs_interp.models.registry.TrainingCache`
(``train_cache``): no two tests train the same (recipe, seed). What the tests build (the variant grid,
``perturb``, version marks) is in ``builders.py``, imported by name."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.models.registry import TrainingCache, held_out_batch
from tests.builders import perturb


def pytest_collection_modifyitems(config, items):
    """The cross-version recording tests run first (a stable sort keeps the rest in order): under
    scripts/test.sh the 4.x pass waits for the 3.x pass's records, which must not wait behind
    3.x's long tests."""
    items.sort(key=lambda item: item.get_closest_marker("cross_version") is None)


@pytest.fixture(scope="session")
def train_cache(tmp_path_factory) -> TrainingCache:
    """One cache for the whole run: every retraining test, CLI run (``--cache``) and the finance
    study share it, so a (recipe, seed) is trained once per test session."""
    return TrainingCache(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="session")
def toy2():
    return ri.load_toy_model("induction-2l")


@pytest.fixture(scope="session")
def toy1():
    return ri.load_toy_model("induction-1l")


@pytest.fixture(scope="session")
def toy2_f64(toy2):
    return ri.as_dtype(toy2, torch.float64)


@pytest.fixture(scope="session")
def toy1_f64(toy1):
    return ri.as_dtype(toy1, torch.float64)


@pytest.fixture(scope="session")
def test_set():
    """The 1000 held-out test sequences every table is evaluated on."""
    return held_out_batch()


@pytest.fixture(scope="session")
def small_batch():
    return ri.induction_batch(32, seed=7)


@pytest.fixture(scope="session")
def random3x3():
    """A random attention-only model of another shape (3 layers of 3 heads), biases nonzero, float64."""
    model = ri.models.make_attn_only(3, n_heads=3, d_head=8, d_model=24, seed=3, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.fixture(scope="session")
def gpt2_tiny():
    """A GPT-2-shaped model (LayerNorm, GELU MLPs, learned positions) small enough to be quick."""
    from rs_interp.models.checkpoints import build_model

    cfg = _backend.make_config(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=300, n_ctx=32,
                               act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard",
                               seed=None, device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model(cfg)
    return perturb(model, 0, bias_scale=0.1).eval()
