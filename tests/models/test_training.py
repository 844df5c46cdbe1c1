import json
import math
import os
import subprocess
import sys

import pytest
import torch

import rs_interp as ri
from rs_interp.models.registry import SHIPPED_MODELS, train_shipped
from rs_interp.models.training import masked_next_token_loss
from rs_interp.reproduce.expected import EXPECTED

INDUCTION = ("induction-1l", "induction-2l")


def test_two_layer_model_solves_induction(toy2, test_set):
    s = ri.score_model(toy2, test_set.tokens, targets=test_set.targets)
    assert EXPECTED["induction.two_layers_loss"].holds(s.loss) and EXPECTED["induction.two_layers_accuracy"].holds(s.accuracy)


def test_one_layer_model_cannot(toy1, test_set):
    s = ri.score_model(toy1, test_set.tokens, targets=test_set.targets)
    assert EXPECTED["induction.one_layer_loss"].holds(s.loss) and EXPECTED["induction.one_layer_accuracy"].holds(s.accuracy)


def test_untrained_model_is_at_chance(test_set):
    s = ri.score_model(ri.models.make_attn_only(2), test_set.tokens, targets=test_set.targets)
    assert abs(s.loss - math.log(256)) < 0.5 and s.accuracy < 0.02


def test_evaluate_matches_score_logits(toy2, small_batch):
    a = ri.score_model(toy2, small_batch.tokens, targets=small_batch.targets, batch_chunk=5)
    b = ri.score_logits(toy2(small_batch.tokens), small_batch.targets)
    assert a.n_scored == b.n_scored == int(small_batch.scored.sum())
    assert a.accuracy == pytest.approx(b.accuracy, abs=1e-12) and a.loss == pytest.approx(b.loss, rel=1e-5)


@pytest.mark.parametrize("full", [True, False], ids=["every position", "scored positions"])
def test_masked_loss_is_cross_entropy_at_the_masked_positions(full):
    """The loss (and its gradient) against a per-position brute force: a full mask takes views, a
    partial one the boolean index; both must give the mean over exactly the masked positions."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 6, 11, dtype=torch.float64, generator=g, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 6), generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool) if full else torch.rand(3, 5, generator=g) > 0.4
    loss, correct = masked_next_token_loss(logits, tokens, mask)
    (grad,) = torch.autograd.grad(loss, logits)
    picked = [(b, p) for b in range(3) for p in range(5) if mask[b, p]]
    brute = sum(-logits[b, p].log_softmax(-1)[tokens[b, p + 1]] for b, p in picked) / len(picked)
    (brute_grad,) = torch.autograd.grad(brute, logits)
    # the loss is taken in float32 (the logits are cast, as a float16 model's would be)
    assert float(loss) == pytest.approx(float(brute), rel=1e-6)
    assert torch.allclose(grad, brute_grad, atol=1e-7)
    assert int(correct) == sum(int(logits[b, p].argmax() == tokens[b, p + 1]) for b, p in picked)


def test_training_restores_thread_count():
    n = torch.get_num_threads()
    ri.models.train_induction_model(1, steps=2, batch_size=4, progress=False)
    assert torch.get_num_threads() == n


def test_short_training_is_bitwise_deterministic_and_learns():
    a = ri.models.train_induction_model(2, steps=30, batch_size=16, seed=11, progress=False)
    b = ri.models.train_induction_model(2, steps=30, batch_size=16, seed=11, progress=False)
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), n
    assert not a.b_V.any() and not a.b_O.any() and not a.b_U.any()
    batch = ri.induction_batch(64, seed=99)
    untrained = ri.models.make_attn_only(2, seed=11)
    assert ri.score_model(a, batch.tokens, targets=batch.targets).loss < ri.score_model(untrained, batch.tokens, targets=batch.targets).loss


@pytest.mark.parametrize("kwargs,arg", [(dict(n_layers=0), "n_layers"), (dict(n_layers=1, batch_size=0), "batch_size"),
                                        (dict(n_layers=1, steps=-1), "steps"), (dict(n_layers=1, lr=0.0), "lr")])
def test_bad_training_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ri.models.train_induction_model(**kwargs, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", INDUCTION)
def test_retraining_from_recorded_seed_reproduces_shipped_metrics(name, train_cache):
    """The shipped checkpoints are this training code's output: retrain, and the test metrics agree
    within the registry's tolerance (not bit for bit: the shipped weights were rounded by another processor)."""
    entry = SHIPPED_MODELS[name]
    trained = train_shipped(name, progress=False, cache=train_cache)
    assert trained.metadata["training"] == entry.metadata()["training"] == dict(entry.settings)
    assert entry.outside_tolerance(trained.metadata) == {}
    # The same circuit, not only the same numbers: the previous-token head is the shipped model's.
    tokens = ri.induction_batch(64, seed=3).tokens
    assert int(ri.prev_token_scores(trained.model, tokens)[0].argmax()) == int(ri.prev_token_scores(entry.load(), tokens)[0].argmax())


_RETRAIN_ON_GENERIC_KERNELS = """
import json, torch
from rs_interp.models.registry import train_shipped
t = train_shipped("induction-2l", progress=False)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), **t.metadata}))
"""


@pytest.mark.slow
def test_retraining_on_another_kernel_path_stays_within_tolerance():
    """ATEN_CPU_CAPABILITY=default forces ATen's generic kernels: another rounding path, standing in
    for another processor. The metrics move (measured ~1e-4) but stay within the tolerance. (Never
    cached: it must train on that path.)"""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    r = subprocess.run([sys.executable, "-c", _RETRAIN_ON_GENERIC_KERNELS], capture_output=True, text=True, env=env, check=True)
    meta = json.loads(r.stdout.strip().splitlines()[-1])
    assert meta.pop("capability") == "DEFAULT"
    assert SHIPPED_MODELS["induction-2l"].outside_tolerance(meta) == {}


@pytest.mark.slow
def test_tolerance_tells_another_seed_apart(train_cache):
    """The tolerance is no blanket: a model trained from another seed falls outside it."""
    trained = train_shipped("induction-2l", seed=1, progress=False, cache=train_cache)
    assert SHIPPED_MODELS["induction-2l"].outside_tolerance(trained.metadata) != {}


def test_training_cache_reads_back_what_it_stored(tmp_path):
    """A cached entry comes back with the same weights and metadata, and the trainer is not called
    again; another seed is another entry."""
    calls = []

    def train(seed):
        calls.append(seed)
        return ri.models.Trained(ri.models.train_induction_model(1, steps=3, batch_size=4, seed=seed, progress=False), {"seed": seed, "x": 0.1})

    cache = ri.models.TrainingCache(tmp_path)
    a = cache.fetch("tiny", {"seed": 1}, lambda: train(1))
    b = cache.fetch("tiny", {"seed": 1}, lambda: train(1))
    c = cache.fetch("tiny", {"seed": 2}, lambda: train(2))
    assert calls == [1, 2]
    for (n, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(p, q), n
    assert b.metadata["x"] == 0.1 and b.metadata["seed"] == 1 and "versions" in b.metadata
    assert not torch.equal(a.model.W_E, c.model.W_E)


@pytest.mark.parametrize("env", [None, "somewhere"])
def test_default_cache_follows_the_environment(env, monkeypatch, tmp_path):
    """``$RS_INTERP_CACHE`` names the default cache's folder; unset, it is under the user's home."""
    monkeypatch.setenv("HOME", str(tmp_path))
    if env is None:
        monkeypatch.delenv(ri.models.TrainingCache.ENV, raising=False)
        assert ri.models.TrainingCache.default().root == tmp_path / ".cache" / "rs_interp" / "trained"
    else:
        monkeypatch.setenv(ri.models.TrainingCache.ENV, str(tmp_path / env))
        assert ri.models.TrainingCache.default().root == tmp_path / env
