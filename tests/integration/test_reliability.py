"""Issue 9: every public helper leaves the model as it found it, and bad input gets a clear error."""

from __future__ import annotations

import inspect
import json
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rs_interp as ri
from rs_interp import finance
from rs_interp.reproduce import gpt2_check

# ---- the registry: every public helper that runs (or reads) a model, called on a toy model ----------


def _batch():
    return ri.induction_batch(4, seed=0)


def _fixed_scores(model):
    """Edge scores that do not depend on the model's numbers: each edge's index in the graph."""
    layout = ri.edge_layout(model)
    effect = torch.arange(layout.exists.numel(), dtype=torch.float64).reshape(layout.exists.shape)
    return ri.circuits.EdgeEffects(layout=layout, effect=effect.masked_fill(~layout.exists, float("nan")), clean=0.0)


def _jlens(model):
    return ri.fit_jacobian_lens(model, _batch().tokens[:2], skip_first=4, progress=False)


def _coordinate_patch(model, *, hooks):
    """A patch of the first atom of the decomposition at layer 0's last position into token 0's coordinate."""
    lens, seq = _jlens(model), _batch().tokens[:1]
    dec = ri.readouts.jspace_decomposition(model, lens, seq[0], 0, position=-1, k=4)
    source = int(dec.support[0])
    if not hooks:
        return ri.readouts.coordinate_patch(model, lens, seq[0], 0, source, 0, position=-1, decomposition=dec)
    hooks = ri.readouts.coordinate_patch_hooks(model, lens, source, 0, [0], positions=[-1], k=4)
    return model.run_with_hooks(seq, fwd_hooks=hooks).float()  # the model's logits, in float32 as the helpers' results


HELPERS = {
    "score_model": lambda m: ri.score_model(m, _batch().tokens, targets=_batch().targets),
    "run_with_key_input": lambda m: ri.run_with_key_input(m, _batch().tokens, layer=1, keep=[(0, 0)]),
    "run_with_query_input": lambda m: ri.run_with_query_input(m, _batch().tokens, layer=1, keep=[(0, 1)]),
    "attention_patterns": lambda m: ri.attention_patterns(m, _batch().tokens),
    "prev_token_scores": lambda m: ri.prev_token_scores(m, _batch().tokens),
    "find_prev_token_head": lambda m: ri.find_prev_token_head(m, _batch().tokens),
    "induction_scores": lambda m: ri.induction_scores(m, _batch().tokens, periods=_batch().periods),
    "positional_scores": lambda m: ri.positional_scores(m, 0),
    "key_score_sensitivity": lambda m: ri.key_score_sensitivity(m, _batch().tokens),
    "composition_scores": lambda m: ri.composition_scores(m, "k", baseline=True),
    "head_affinity": lambda m: ri.head_affinity(m, "k"),
    "head_affinities": lambda m: ri.head_affinities(m, which=("q", "v")),
    "path_expansion": lambda m: ri.path_expansion(m, _batch().tokens),
    "path_logit_attribution": lambda m: ri.path_logit_attribution(m, _batch().tokens, targets=_batch().targets),
    "direct_logit_attribution": lambda m: ri.direct_logit_attribution(m, _batch().tokens, targets=_batch().tokens),
    "logit_lens": lambda m: ri.logit_lens(m, _batch().tokens, targets=_batch().tokens, batch_chunk=3),
    "count_parameters": lambda m: ri.count_parameters(m),
    "train_tuned_lens": lambda m: ri.train_tuned_lens(m, _batch().tokens, steps=2, progress=False),
    "lens_kl": lambda m: ri.lens_kl(m, _batch().tokens),
    "first_token_attention": lambda m: ri.first_token_attention(m, _batch().tokens),
    "ablate_heads": lambda m: ri.ablate_heads(m, _batch().tokens, [(0, 0), (1, 1)], ablation="resample",
                                              reference=ri.induction_batch(4, seed=1).tokens),
    "head_ablation_scan": lambda m: ri.head_ablation_scan(m, _batch().tokens, lambda lg: lg[:, -1].float().mean(), ablation="mean"),
    "copying_scores": lambda m: ri.copying_scores(m),
    "virtual_weight": lambda m: ri.virtual_weight(m, (0, 0), (1, 1), "v"),
    "attribution_patching": lambda m: ri.attribution_patching(m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
                                                              reference=ri.induction_batch(4, seed=1).tokens),
    "edge_attribution_patching": lambda m: ri.edge_attribution_patching(m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
                                                                        reference=ri.induction_batch(4, seed=1).tokens),
    "edge_layout": lambda m: ri.edge_layout(m),
    "ungroup_gqa": lambda m: ri.circuits.ungroup_gqa(m),
    "path_patching": lambda m: ri.path_patching(m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
                                                reference=ri.induction_batch(4, seed=1).tokens, edges=[("embed", "logits")]),
    "evaluate_circuit": lambda m: ri.evaluate_circuit(m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
                                                      [("embed", "logits")], reference=ri.induction_batch(4, seed=1).tokens),
    # the circuits from fixed scores (the same edges in every dtype: a half-precision estimate ranks them otherwise)
    "faithfulness_curve": lambda m: ri.faithfulness_curve(
        m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(), _fixed_scores(m),
        reference=ri.induction_batch(4, seed=1).tokens, fractions=(0.5, 1.0)),
    "mib_scores": lambda m: ri.mib_scores(
        m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(), _fixed_scores(m),
        reference=ri.induction_batch(4, seed=1).tokens, fractions=(0.5, 1.0)),
    "acdc": lambda m: ri.acdc(m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
                              reference=ri.induction_batch(4, seed=1).tokens, threshold=0.01, progress=False),
    "fix_unreliable": lambda m: ri.fix_unreliable(
        m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
        ri.edge_attribution_patching(m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
                                     reference=ri.induction_batch(4, seed=1).tokens, correction="hessian"),
        reference=ri.induction_batch(4, seed=1).tokens),
    "relevance_patching": lambda m: ri.relevance_patching(m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(),
                                                          reference=ri.induction_batch(4, seed=1).tokens),
    "edge_relevance_patching": lambda m: ri.edge_relevance_patching(
        m, _batch().tokens, lambda lg: lg[:, -1].float().logsumexp(-1).mean(), reference=ri.induction_batch(4, seed=1).tokens),
    # the Jacobian lens (issue 62): a lens fitted to the model at hand (its dtype), the hook factories run as a user does
    "fit_jacobian_lens": lambda m: _jlens(m),
    "jacobian_lens": lambda m: ri.jacobian_lens(m, _batch().tokens, _jlens(m)),
    "lens_vectors": lambda m: ri.readouts.lens_vectors(m, _jlens(m), [3, 5], 0),
    "lens_steering_hooks": lambda m: m.run_with_hooks(_batch().tokens, fwd_hooks=ri.readouts.lens_steering_hooks(m, _jlens(m), 7, [0])),
    "lens_ablation_hooks": lambda m: m.run_with_hooks(_batch().tokens, fwd_hooks=ri.readouts.lens_ablation_hooks(m, _jlens(m), [3, 4], [0])),
    "lens_swap_hooks": lambda m: m.run_with_hooks(_batch().tokens, fwd_hooks=ri.readouts.lens_swap_hooks(m, _jlens(m), 3, 4, [0])),
    "jspace_decomposition": lambda m: ri.readouts.jspace_decomposition(m, _jlens(m), _batch().tokens[0], 0, position=-1, k=4),
    "jspace_occupancy": lambda m: ri.readouts.jspace_occupancy(m, _jlens(m), _batch().tokens[0], 0, position=-1, max_atoms=4, controls=2),
    "jspace_variance": lambda m: ri.readouts.jspace_variance(m, _jlens(m), _batch().tokens[:1, :8], k=3, skip_first=4, progress=False),
    "coordinate_patch": lambda m: _coordinate_patch(m, hooks=False),
    "coordinate_patch_hooks": lambda m: _coordinate_patch(m, hooks=True),
    "certify": lambda m: ri.certify(m, refresh=True),
    "second_order_attribution": lambda m: ri.second_order_attribution(m, _batch().tokens, targets=_batch().tokens, positions=[-1]),
    "as_dtype": lambda m: ri.as_dtype(m, torch.float64),
    "save_model": lambda m: ri.models.save_model(m, __import__("tempfile").mkdtemp() + "/m"),
    "analyse_gpt2": lambda m: gpt2_check.analyse_gpt2(m, weights="random", n_sequences=2, period=20),
    "finance_readers": lambda m: finance.complete_queries(
        {"model": finance._model_reader(m), "direct": finance._model_reader(m, direct_only=True)},
        finance.find_queries(finance.make_corpus(n_train=1, n_seen=2, n_unseen=1).seen)[:3]),
}


def _takes_a_model(obj) -> bool:
    try:
        params = list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] in ("model", "model_or_cfg")


def test_every_public_helper_is_covered():
    """A new public helper that takes a model must be added to HELPERS (and so to these tests)."""
    public = {name for name in ri.__all__ if inspect.isfunction(getattr(ri, name)) and _takes_a_model(getattr(ri, name))}
    assert public - set(HELPERS) == set(), f"helpers without state-safety coverage: {sorted(public - set(HELPERS))}"


# ---- the snapshot of everything a helper could leave behind ----------------------------------------


def _snapshot(model):
    return {
        "hooks": {name: (len(hp._forward_hooks), len(hp._backward_hooks), len(hp.fwd_hooks), len(hp.bwd_hooks))
                  for name, hp in model.hook_dict.items()},
        "module_hooks": sum(not _bridge_wiring(f) for m in model.modules()
                            for f in (*m._forward_hooks.values(), *m._forward_pre_hooks.values(), *m._backward_hooks.values())),
        "cfg": json.dumps({k: repr(v) for k, v in vars(model.cfg).items()}, sort_keys=True),
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "grad": torch.is_grad_enabled(),
        "threads": torch.get_num_threads(),
    }


def _bridge_wiring(fn) -> bool:
    """TransformerLens 4's own capture hooks, which a bridge wires once, on first need, and keeps."""
    return "_maybe_wire_capture_hooks" in getattr(fn, "__qualname__", "")


def _assert_same(before, after):
    assert after["hooks"] == before["hooks"], "a hook was left attached (or a user hook removed)"
    assert after["module_hooks"] == before["module_hooks"]
    assert after["cfg"] == before["cfg"], "a cfg flag was left flipped"
    for k, v in before["weights"].items():
        assert torch.equal(after["weights"][k], v), f"weight {k} changed"
    assert after["training"] == before["training"], "training mode changed"
    assert after["grad"] == before["grad"], "torch.is_grad_enabled() changed"
    assert after["threads"] == before["threads"]


def _model_for(name):
    if name in ("analyse_gpt2",):
        from rs_interp.models.checkpoints import build_model
        from rs_interp.models.gpt2_sizes import gpt2_config

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return build_model(gpt2_config("small", n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=500, n_ctx=64))
    if name == "ungroup_gqa":  # needs grouped-query attention
        from tests.builders import make_variant

        return make_variant("LN", "rotary", True, "gqa", dtype=torch.float32, n_heads=4)
    return ri.load_toy_model("induction-2l")


@pytest.mark.parametrize("name", sorted(HELPERS))
@pytest.mark.parametrize("training,grad", [(False, True), (True, False), ("mixed", True)])
def test_helper_leaves_model_as_found(name, training, grad):
    model = _model_for(name)
    if training == "mixed":  # train mode with one block held in eval mode: each flag must come back as found
        model.train()
        model.blocks[0].eval()
    else:
        model.train(training)
    fired = []
    model.add_hook("hook_embed", lambda t, hook: fired.append(1))  # the user's own hook
    before = _snapshot(model)
    with torch.set_grad_enabled(grad):
        before["grad"] = torch.is_grad_enabled()
        HELPERS[name](model)
        after = _snapshot(model)
    _assert_same(before, after)
    n = len(fired)
    model(torch.zeros(1, 3, dtype=torch.long))
    assert len(fired) == n + 1, "the user's hook must stay attached and still fire"


class _Injected(RuntimeError):
    pass


_WEIGHTS_ONLY = {"composition_scores", "head_affinity", "head_affinities", "copying_scores", "virtual_weight",
                 "count_parameters", "positional_scores", "as_dtype", "save_model", "edge_layout", "ungroup_gqa"}


@pytest.mark.parametrize("name", sorted(set(HELPERS) - _WEIGHTS_ONLY))
def test_helper_cleans_up_after_a_failing_hook(name):
    """A user hook that raises mid-forward: the error propagates and nothing of the helper's stays."""
    model = _model_for(name)
    armed = {"on": False}

    def boom(t, hook):
        if armed["on"]:
            raise _Injected("injected")

    model.add_hook(f"blocks.{model.cfg.n_layers - 1}.hook_resid_pre", boom)
    before = _snapshot(model)
    armed["on"] = True
    with pytest.raises(_Injected):
        HELPERS[name](model)
    armed["on"] = False
    _assert_same(before, _snapshot(model))


# ---- bad input: a ValueError naming the argument, and no hook left behind ---------------------------------

GOOD = ri.induction_batch(2, seed=0).tokens
BAD_TOKENS = {
    "out of vocabulary": GOOD.clone().index_fill_(1, torch.tensor([3]), 256),
    "negative": GOOD.clone().index_fill_(1, torch.tensor([0]), -1),
    "float dtype": GOOD.float(),
    "bool dtype": GOOD > 3,
    "3-d": GOOD[None],
    "too long": torch.zeros(1, 49, dtype=torch.long),
    "empty": torch.zeros(1, 0, dtype=torch.long),
    "not a tensor": GOOD.tolist(),
}
TOKEN_HELPERS = {
    "run_with_key_input": lambda m, t: ri.run_with_key_input(m, t, layer=1),
    "run_with_query_input": lambda m, t: ri.run_with_query_input(m, t, layer=1),
    "prev_token_scores": lambda m, t: ri.prev_token_scores(m, t),
    "attention_patterns": lambda m, t: ri.attention_patterns(m, t),
    "key_score_sensitivity": lambda m, t: ri.key_score_sensitivity(m, t),
    "path_expansion": lambda m, t: ri.path_expansion(m, t),
    "direct_logit_attribution": lambda m, t: ri.direct_logit_attribution(m, t, targets=t),
    "logit_lens": lambda m, t: ri.logit_lens(m, t),
}


@pytest.fixture(scope="module")
def shared_toy():
    return ri.load_toy_model("induction-2l")


@pytest.mark.parametrize("helper", sorted(TOKEN_HELPERS))
@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_bad_tokens(shared_toy, helper, case):
    before = _snapshot(shared_toy)
    with pytest.raises(ValueError, match="tokens"):
        TOKEN_HELPERS[helper](shared_toy, BAD_TOKENS[case])
    _assert_same(before, _snapshot(shared_toy))


BAD_CALLS = {
    "layer out of range": (lambda m: ri.run_with_key_input(m, GOOD, layer=2), "layer"),
    "negative layer": (lambda m: ri.run_with_query_input(m, GOOD, layer=-1), "layer"),
    "keep at the layer": (lambda m: ri.run_with_key_input(m, GOOD, layer=1, keep=[(1, 0)]), "keep"),
    "keep after the layer": (lambda m: ri.run_with_key_input(m, GOOD, layer=0, keep=[(1, 0)]), "keep"),
    "keep head out of range": (lambda m: ri.run_with_key_input(m, GOOD, layer=1, keep=[(0, 7)]), "keep"),
    "heads out of range": (lambda m: ri.run_with_key_input(m, GOOD, layer=1, heads=[(1, 2)]), "heads"),
    "heads outside the layer": (lambda m: ri.run_with_key_input(m, GOOD, layer=1, heads=[(0, 1)]), "heads"),
    "positional layer": (lambda m: ri.positional_scores(m, 3), "layer"),
    "positional offset": (lambda m: ri.positional_scores(m, 0, max_offset=48), "max_offset"),
    "composition which": (lambda m: ri.composition_scores(m, "W"), "which"),
    "targets shape": (lambda m: ri.path_expansion(m, GOOD, targets=GOOD[:, :5]), "targets"),
    "targets vocab": (lambda m: ri.path_expansion(m, GOOD, targets=GOOD + 300), "targets"),
    "dla targets shape": (lambda m: ri.direct_logit_attribution(m, GOOD, targets=GOOD[:1]), "targets"),
    "dla contrast": (lambda m: ri.direct_logit_attribution(m, GOOD, targets=GOOD, contrast=GOOD.float()), "contrast"),
    "lens targets": (lambda m: ri.logit_lens(m, GOOD, targets=GOOD[:, :3]), "targets"),
    "lens k": (lambda m: ri.logit_lens(m, GOOD, k=0), "k"),
    "path expansion on LN": (lambda m: ri.path_expansion(ri.models.make_attn_only(1, normalization_type="LN"), GOOD), "LayerNorm"),
    "score_model chunk": (lambda m: ri.score_model(m, ri.induction_batch(2).tokens, targets=ri.induction_batch(2).targets, batch_chunk=0), "batch_chunk"),
    "batch_size": (lambda m: ri.induction_batch(0), "batch_size"),
    "min_period": (lambda m: ri.induction_batch(2, min_period=0), "min_period"),
    "max_period": (lambda m: ri.induction_batch(2, max_period=100), "max_period"),
    "n_layers": (lambda m: ri.models.make_attn_only(0), "n_layers"),
    "toy name": (lambda m: ri.load_toy_model("nope"), "name"),
    "gpt2 size": (lambda m: ri.models.gpt2_config("tiny"), "size"),
    "train lr": (lambda m: ri.models.train_induction_model(1, lr=-1.0, progress=False), "lr"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments(shared_toy, case):
    fn, arg = BAD_CALLS[case]
    before = _snapshot(shared_toy)
    with pytest.raises(ValueError, match=arg):
        fn(shared_toy)
    _assert_same(before, _snapshot(shared_toy))


# ---- checkpoints --------------------------------------------------------------------------------------------


@pytest.fixture()
def checkpoint(tmp_path, shared_toy):
    return ri.models.save_model(shared_toy, tmp_path / "toy")


def _edit_config(cfg, change):
    """Rewrite a checkpoint's config.json with ``change`` applied to its "config" mapping."""
    d = json.loads(cfg.read_text())
    change(d["config"])
    cfg.write_text(json.dumps(d))


def _corrupt(path, how):
    cfg, w = path.with_name(path.name + ".json"), path.with_name(path.name + ".safetensors")
    if how == "missing weights":
        w.unlink()
    elif how == "missing config":
        cfg.unlink()
    elif how == "truncated weights":
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif how == "garbage weights":
        w.write_bytes(b"\x00\x01garbage" * 10)
    elif how == "not json":
        cfg.write_text("{not json")
    elif how == "json list":
        cfg.write_text("[1, 2]")
    elif how == "missing field":
        _edit_config(cfg, lambda c: c.pop("d_model"))
    elif how == "wrong field type":
        _edit_config(cfg, lambda c: c.update(n_heads="two"))
    elif how == "unknown field":
        _edit_config(cfg, lambda c: c.update(evil=1))
    elif how == "shape mismatch":
        _edit_config(cfg, lambda c: c.update(d_vocab=300))
    elif how == "bad dtype":
        _edit_config(cfg, lambda c: c.update(dtype="os.system"))


CORRUPTIONS = ["missing weights", "missing config", "truncated weights", "garbage weights", "not json", "json list",
               "missing field", "wrong field type", "unknown field", "shape mismatch", "bad dtype"]


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_bad_checkpoints(checkpoint, how):
    _corrupt(checkpoint, how)
    with pytest.raises(ri.models.CheckpointError):
        ri.models.load_model(checkpoint)


def test_checkpoint_path_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ri.models.load_model(tmp_path / "nothing")


def test_no_pickle_anywhere_in_the_library():
    """Loading never unpickles: no torch.load / pickle in rs_interp (safetensors + JSON only)."""
    import pathlib

    src = pathlib.Path(ri.__file__).parent
    for f in list(src.glob("*.py")) + list((src.parent / "hooks").glob("*.py")):
        text = f.read_text()
        assert not re.search(r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b|pickle\.loads?\(", text, re.M), f
        for line in text.splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{f}: {line}"


# ---- determinism ------------------------------------------------------------------------------------------------


def test_same_seed_same_weights_across_processes():
    import subprocess
    import sys

    code = ("import hashlib, rs_interp as ri\n"
            "m = ri.models.train_induction_model(2, steps=20, batch_size=8, seed=5, progress=False)\n"
            "print(hashlib.sha256(b''.join(v.numpy().tobytes() for v in m.state_dict().values())).hexdigest())")
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]  # side by side
    hashes = {run.communicate()[0].strip() for run in runs}
    assert all(run.returncode == 0 for run in runs)
    m = ri.models.train_induction_model(2, steps=20, batch_size=8, seed=5, progress=False)
    import hashlib

    here = hashlib.sha256(b"".join(v.numpy().tobytes() for v in m.state_dict().values())).hexdigest()
    assert hashes == {here}


# ---- property-based ----------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 3), pos=st.integers(1, 48), seed=st.integers(0, 2**16),
       n_layers=st.integers(1, 3), n_heads=st.integers(1, 3))
def test_path_expansion_is_exact_for_random_shapes(batch, pos, seed, n_layers, n_heads):
    model = ri.models.make_attn_only(n_layers, n_heads=n_heads, d_head=8, d_model=16, seed=seed % 100, dtype=torch.float64)
    tokens = torch.randint(0, 256, (batch, pos), generator=torch.Generator().manual_seed(seed))
    pe = ri.path_expansion(model, tokens)
    assert len(pe.labels) == (1 + n_heads) ** n_layers
    assert (pe.total() - model(tokens)).abs().max() <= 1e-10


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layer=st.integers(-3, 4), keep=st.lists(st.tuples(st.integers(-1, 3), st.integers(-1, 3)), max_size=3))
def test_ablation_arguments_either_run_or_raise_valueerror(shared_toy, layer, keep):
    valid = 0 <= layer < 2 and all(0 <= l < layer and 0 <= h < 2 for l, h in keep) and len(set(keep)) == len(keep)
    try:
        out = ri.run_with_key_input(shared_toy, GOOD, layer=layer, keep=keep)
    except ValueError:
        assert not valid
    else:
        assert valid and out.shape == (2, 48, 256)
    assert not shared_toy.cfg.use_split_qkv_input


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(st.integers(-5, 300), min_size=0, max_size=60), width=st.integers(1, 60))
def test_random_token_values_either_run_or_raise_valueerror(shared_toy, data, width):
    tokens = torch.tensor(data, dtype=torch.long)
    if len(data) >= width and len(data) % width == 0:
        tokens = tokens.reshape(-1, width)
    valid = len(data) > 0 and tokens.ndim <= 2 and tokens.shape[-1] <= 48 and min(data) >= 0 and max(data) < 256
    try:
        ri.logit_lens(shared_toy, tokens, k=2)
    except ValueError:
        assert not valid
    else:
        assert valid


@pytest.mark.parametrize("name", sorted(set(HELPERS) - {"save_model", "count_parameters", "finance_readers", "as_dtype", "ungroup_gqa"}))
def test_helpers_accept_float64_models(name):
    model = ri.as_dtype(_model_for(name), torch.float64)
    out = HELPERS[name](model)
    tensors = [v for v in (out if isinstance(out, tuple) else vars(out).values() if hasattr(out, "__dict__") else [out])
               if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert all(t.dtype == torch.float64 for t in tensors), [t.dtype for t in tensors]


@pytest.mark.slow
def test_tables_are_identical_across_processes(tmp_path):
    import subprocess
    import sys

    # Two processes side by side (the second core is free once the other pass of scripts/test.sh ends)
    runs = [subprocess.Popen([sys.executable, "-m", "rs_interp.ui.cli", "reproduce", "--only", "induction", "paths", "geometry",
                              "--quiet", "--out", str(tmp_path / name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for name in ("a", "b")]
    for run in runs:
        out, err = run.communicate()
        assert run.returncode == 0, err.decode()[-2000:]
    a, b = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("a", "b"))
    assert set(a["cost"]) == set(b["cost"])  # the sections' CPU and wall seconds: the machine's, not a table
    a.pop("cost"), b.pop("cost")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # every table, to the last digit


def test_tables_are_identical_within_a_process():
    from rs_interp.reproduce import Context, run_sections

    first = [s.results for s in run_sections(Context(progress=False), ["circuits"])]
    second = [s.results for s in run_sections(Context(progress=False), ["circuits"])]
    assert first == second


# ---- issue 12: half precision, empty selections ---------------------------------------------------------------

# helpers whose output is a thresholded choice of edges, or a greedy choice of atoms (the J-space's OMP)
_DECIDES = {"acdc", "fix_unreliable", "jspace_decomposition", "jspace_occupancy", "coordinate_patch", "coordinate_patch_hooks"}
_HALF_TOLERANCE = {torch.float16: 0.05, torch.bfloat16: 0.3}  # |half - float32| on the toy model's logit-sized outputs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(set(HELPERS) - {"save_model", "count_parameters", "finance_readers", "as_dtype", "ungroup_gqa"}))
def test_helpers_run_on_half_precision_models(name, dtype):
    """Every helper runs on float16/bfloat16 models and agrees with the float32 run within the
    documented tolerance (decompositions compute in float32 inside)."""
    ref = _model_for(name)
    half = ri.as_dtype(ref, dtype)
    out, want = HELPERS[name](half), HELPERS[name](ref)
    if name == "certify":  # no tensors: the identities hold in half precision too, within its tolerance
        assert out.failed() == () == want.failed() and out.dtype == dtype
        return
    pairs = _tensor_pairs(out, want)
    assert pairs, name
    if name in _DECIDES:  # a threshold picks the edges: half precision may move a borderline one across it
        assert type(out) is type(want) and all(a.shape == b.shape and a.dtype == b.dtype for a, b in pairs), name
        assert all(bool(torch.isfinite(a[torch.isfinite(b)]).all()) for a, b in pairs if a.is_floating_point()), name
        return
    for a, b in pairs:
        if a.dtype in (torch.long, torch.bool):  # indices, or a layout's edge mask: the same in any dtype
            assert a.dtype == torch.long or torch.equal(a, b), name
            continue
        finite = torch.isfinite(b)
        assert bool(torch.isfinite(a[finite]).all())
        scale = max(1.0, float(b[finite].abs().max()))
        assert float((a.float() - b.float())[finite].abs().max()) <= _HALF_TOLERANCE[dtype] * scale, name


def _tensor_pairs(a, b):
    if hasattr(a, "AB"):  # a FactoredMatrix: compare the product
        return [(a.AB, b.AB)]
    if isinstance(a, torch.Tensor):
        return [(a, b)]
    if isinstance(a, tuple):
        return [p for x, y in zip(a, b) for p in _tensor_pairs(x, y)]
    if isinstance(a, dict):  # results by name (head_affinities)
        assert a.keys() == b.keys()
        return [p for k in a for p in _tensor_pairs(a[k], b[k])]
    if hasattr(a, "__dataclass_fields__"):
        return [p for k in a.__dataclass_fields__ for p in _tensor_pairs(getattr(a, k), getattr(b, k))]
    if isinstance(a, float):
        return [(torch.tensor(a), torch.tensor(b))]
    if isinstance(a, int) and not isinstance(a, bool):  # e.g. a head index: equal, or off by at least 1
        return [(torch.tensor(float(a)), torch.tensor(float(b)))]
    return []


def test_empty_selections_raise(toy2):
    b = _batch()
    empty = ri.models.InductionBatch(tokens=b.tokens, periods=b.periods, scored=torch.zeros_like(b.scored))
    too_long = torch.full_like(b.periods, b.tokens.shape[1])  # every period as long as the sequence: nothing scored
    for call in (lambda: ri.score_model(toy2, empty.tokens, targets=empty.targets), lambda: ri.induction_scores(toy2, empty.tokens, periods=too_long),
                 lambda: ri.path_logit_attribution(toy2, empty.tokens, targets=empty.targets), lambda: ri.score_logits(toy2(empty.tokens), empty.targets)):
        with pytest.raises(ValueError, match="no (scored )?position"):
            call()
    with pytest.raises(ValueError, match="heads is empty"):
        ri.run_with_key_input(toy2, empty.tokens, layer=1, heads=[])
